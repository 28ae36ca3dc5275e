"""IMDB sentiment steering, the CORY paper's first task: continue a review opening positively.

Queries are the first 2-8 tokens of reviews. Offline, they come from review openings
written for this project and shipped as package data; with a hub (or a local copy),
from a ``datasets`` dataset such as ``stanfordnlp/imdb``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from cory_env.rewards import RewardCallable, make_reward
from cory_env.tasks import register_task
from cory_env.tasks._checks import (
    optional_positive_int,
    positive_int,
    select_count,
)
from cory_env.tasks.base import Query, Task

OPENINGS_FILE = "imdb_openings.txt"
OBSERVER_TEMPLATE = 'I can make this sentence "{sentence}" more positive: {query}'
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_openings() -> list[str]:
    """The packaged review openings (one per line), read as package data."""
    path = resources.files("cory_env") / "data" / OPENINGS_FILE
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _load_dataset_texts(dataset: str, split: str) -> list[str]:
    suffix = Path(dataset).suffix.lower()
    try:
        if suffix == ".txt":
            return Path(dataset).read_text(encoding="utf-8").splitlines()
        import datasets

        if suffix in _FILE_BUILDERS:  # a local file: its single split is "train"
            data = datasets.load_dataset(_FILE_BUILDERS[suffix], data_files=dataset, split="train")
        else:
            data = datasets.load_dataset(dataset, split=split)
    except Exception as err:  # no hub, missing path, bad split: one clear message
        raise RuntimeError(
            f"imdb task: could not load dataset {dataset!r} (split {split!r}): {err}. "
            "Without a dataset hub, use dataset=None for the packaged review openings."
        ) from err
    if "text" not in data.column_names:
        raise ValueError(
            f"imdb task: dataset {dataset!r} has no 'text' column; its columns are "
            f"{data.column_names}"
        )
    return [str(t) for t in data["text"]]


def cut_query(text: str, n_tokens: int, tokenizer: Any = None) -> str:
    """The first ``n_tokens`` tokens of ``text``: tokenizer tokens if given, else words."""
    if tokenizer is None:
        return " ".join(text.split()[:n_tokens])
    # Only the head of a long review matters; 64 characters per token is ample.
    ids = tokenizer.encode(text[: 64 * (n_tokens + 1)], add_special_tokens=False)
    return tokenizer.decode(ids[:n_tokens], skip_special_tokens=True)


def imdb_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """Pioneer: the opening itself. Observer: the paper's "more positive" rewrite prompt."""
    if role == 0:
        return query.text
    if not earlier:
        raise ValueError(f"imdb prompt for role {role} needs an earlier response; got none")
    return OBSERVER_TEMPLATE.format(sentence=query.text + earlier[-1], query=query.text)


@register_task("imdb")
def make_imdb_task(
    *,
    dataset: str | None = None,
    split: str = "train",
    reward: str | RewardCallable = "vader",
    n_queries: int | None = None,
    min_query_tokens: int = 2,
    max_query_tokens: int = 8,
    tokenizer: Any = None,
    seed: int = 0,
    max_new_tokens: int | tuple[int, int] = (4, 16),
    context_length: int = 96,
) -> Task:
    """IMDB sentiment task.

    ``dataset=None`` uses the packaged openings; otherwise a hub id, a local dataset
    directory, or a local .txt/.json/.jsonl/.csv/.parquet file with a "text" column.
    ``n_queries`` keeps a random subset (``seed``). Each text is cut to its first k
    tokens, k drawn per query from ``min_query_tokens..max_query_tokens`` inclusive;
    tokens of ``tokenizer`` (a Hugging Face tokenizer) if given, else whitespace words.
    ``max_new_tokens=(low, high)`` means a budget drawn per episode from
    ``low..high-1`` (high exclusive), so the default (4, 16) gives the paper's 4..15.
    ``reward`` is a name for :func:`cory_env.rewards.make_reward` ("vader",
    "classifier", a classifier id/path) or a callable; it scores query + response.
    """
    name = "imdb"
    min_query_tokens = positive_int(name, "min_query_tokens", min_query_tokens)
    max_query_tokens = positive_int(name, "max_query_tokens", max_query_tokens)
    if min_query_tokens > max_query_tokens:
        raise ValueError(
            f"task 'imdb': min_query_tokens={min_query_tokens} is larger than "
            f"max_query_tokens={max_query_tokens}"
        )
    n_queries = optional_positive_int(name, "n_queries", n_queries)
    budget = max_new_tokens
    context_length = positive_int(name, "context_length", context_length)
    if tokenizer is not None and not (
        hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")
    ):
        raise TypeError(
            f"task 'imdb': tokenizer must have encode() and decode(), got {tokenizer!r}"
        )

    raw = load_openings() if dataset is None else _load_dataset_texts(dataset, split)
    texts = [t for t in (" ".join(_BR.sub(" ", r).split()) for r in raw) if t]
    if not texts:
        raise ValueError(f"task 'imdb': dataset {dataset!r} has no non-empty texts")

    rng = np.random.default_rng(seed)
    count = select_count(name, len(texts), n_queries)
    if count < len(texts):
        texts = [texts[i] for i in rng.choice(len(texts), size=count, replace=False)]
    lengths = rng.integers(min_query_tokens, max_query_tokens + 1, size=len(texts))
    queries = [Query(cut_query(t, int(k), tokenizer)) for t, k in zip(texts, lengths, strict=True)]

    return Task(
        name=name,
        queries=queries,
        reward_fn=make_reward(reward),
        prompt_fn=imdb_prompt,
        max_new_tokens=budget,
        context_length=context_length,
        metadata={
            "source": "packaged openings" if dataset is None else dataset,
            "split": split,
            "reward": reward if isinstance(reward, str) else getattr(reward, "__name__", "custom"),
            "query_tokens": (min_query_tokens, max_query_tokens),
        },
    )
