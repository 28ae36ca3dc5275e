"""The fixed evaluation set: distinct held-out queries, each answered ``samples`` times.

Everything an answer depends on besides the policy is fixed here, by the evaluation seed
and the answer's (query, sample) pair alone: the token budget of the answer, and the
uniforms its tokens are drawn with (common random numbers, ``PPOAgent.use_sampling_noise``).
Nothing depends on the learner, the algorithm, ``group_size``, the batch size or the
number of processes, so every learner, and the base model, answers the same set, and a
paired difference per query compares policies rather than draws.

Answers are played sample by sample: all queries once with sample 0, then with sample 1,
and so on, so every query appears exactly once per sample index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_BUDGET_STREAM, _NOISE_STREAM = 0, 1
"""Independent substreams of the evaluation seed: budgets and sampling uniforms."""


def distinct(texts: Sequence[str]) -> list[int]:
    """Indices of the first occurrence of each distinct text, in order."""
    seen: set[str] = set()
    keep = []
    for i, text in enumerate(texts):
        if text not in seen:
            seen.add(text)
            keep.append(i)
    return keep


@dataclass(frozen=True)
class EvalSet:
    """Distinct queries x samples, with a budget per answer and uniforms per answer and role."""

    texts: tuple[str, ...]
    """The distinct queries, in the task's order."""
    task_index: tuple[int, ...]
    """Each query's index in the task's query list (what the game is reset with)."""
    samples: int
    seed: int
    budget_low: int
    budget_high: int
    """Budgets are drawn from ``budget_low..budget_high`` (both included)."""

    @classmethod
    def build(
        cls,
        queries: Sequence[str],
        samples: int,
        seed: int,
        budget: tuple[int, int],
        max_queries: int | None = None,
    ) -> EvalSet:
        """The set of a task's held-out query texts: duplicates dropped (the first kept),
        then the first ``max_queries`` of them."""
        keep = distinct(queries)[:max_queries]
        if samples < 1:
            raise ValueError(f"eval_samples must be >= 1 (answers per query), got {samples}")
        return cls(tuple(queries[i] for i in keep), tuple(keep), samples, seed, *budget)

    @property
    def n_queries(self) -> int:
        return len(self.texts)

    @property
    def n_answers(self) -> int:
        return self.n_queries * self.samples

    def budget(self, query: int, sample: int) -> int:
        """The token budget of one answer."""
        rng = np.random.default_rng([self.seed, _BUDGET_STREAM, query, sample])
        return int(rng.integers(self.budget_low, self.budget_high + 1))

    def budgets(self) -> np.ndarray:
        """(queries, samples) budgets."""
        return np.array(
            [[self.budget(q, s) for s in range(self.samples)] for q in range(self.n_queries)],
            dtype=np.int64,
        )

    def noise(self, query: int, sample: int, role: int) -> np.ndarray:
        """The uniforms that draw the tokens of one answer in one role (``budget_high``)."""
        rng = np.random.default_rng([self.seed, _NOISE_STREAM, query, sample, role])
        return rng.random(self.budget_high)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Query and sample of every answer, sample-major: (queries * samples,) each."""
        queries = np.tile(np.arange(self.n_queries), self.samples)
        samples = np.repeat(np.arange(self.samples), self.n_queries)
        return queries, samples

    def batches(self, max_batch_size: int) -> tuple[int, list[np.ndarray]]:
        """The game's batch size and the item numbers of each batch, in order.

        As few batches as ``max_batch_size`` allows, all of one size; the last one is
        filled up with its own first items, which are played but not recorded (each
        batch's array lists only its real items, the game pads to the batch size).
        """
        n = self.n_answers
        count = math.ceil(n / max_batch_size)
        size = math.ceil(n / count)
        return size, [np.arange(start, min(start + size, n)) for start in range(0, n, size)]

    def describe(self) -> dict:
        """The set as written into ``eval.json``: anyone can rebuild it from this."""
        return {
            "seed": self.seed,
            "samples": self.samples,
            "budget_range": [self.budget_low, self.budget_high],
            "queries": list(self.texts),
            "task_index": list(self.task_index),
            "budgets": self.budgets().tolist(),
        }


def padded(items: np.ndarray, size: int) -> np.ndarray:
    """``items`` repeated cyclically up to ``size`` entries (the real ones first)."""
    return np.resize(items, size)
