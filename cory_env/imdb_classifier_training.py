"""Fine-tuning and measuring the IMDB classifier (:mod:`cory_env.imdb_classifier` builds it).

The settings of a build, the head+tail cut of a review to its tokens, the training loop and
the held-out accuracy: what a build runs, apart from where it reads and writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cory_env import checks
from cory_env.imdb_reviews import Review, clean


@dataclass(frozen=True)
class BuildSettings:
    """How the classifier is trained and measured (the defaults are the documented build)."""

    n_train: int = 10000
    """Training reviews, drawn with ``seed`` from the train split (four fifths)."""
    n_eval: int = 2000
    """Held-out reviews the accuracy is measured on, drawn with ``seed`` from the test split."""
    max_length: int = 256
    """Tokens a review is cut to, [CLS] and [SEP] included: its head and its tail."""
    head_tokens: int = 64
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
