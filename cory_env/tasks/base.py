"""What a task is: queries, one prompt template per role, a batched reward function."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Query:
    """One query of a task. ``answer`` is the gold answer where the task has one."""

    text: str
    answer: str | None = None


RewardFn = Callable[[Sequence[Query], Sequence[str]], Sequence[float]]
"""Batched reward: ``reward_fn(queries, responses) -> one score per pair``."""

PromptFn = Callable[[int, Query, Sequence[str]], str]
"""``prompt_fn(role, query, earlier_responses) -> prompt text``; role 0 is the pioneer."""


def continuation_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """Plain continuation for every role (role and earlier answers ignored)."""
    return query.text


def budget_range(max_new_tokens: int | Sequence[int]) -> tuple[int, int]:
    """Normalise a budget to ``(low, high)`` drawn as ``integers(low, high + 1)``.

    An int ``n`` is always ``n`` tokens; a pair ``(low, high)`` draws from ``low..high-1``
    per episode, like the paper's ``LengthSampler(4, 16)``.
    """
    if isinstance(max_new_tokens, (int, np.integer)) and not isinstance(max_new_tokens, bool):
        low = high = int(max_new_tokens)
    elif (
        isinstance(max_new_tokens, Sequence)
        and len(max_new_tokens) == 2
        and all(isinstance(v, (int, np.integer)) for v in max_new_tokens)
    ):
        low, high = int(max_new_tokens[0]), int(max_new_tokens[1]) - 1
    else:
        raise ValueError(
            f"max_new_tokens must be an int or a (low, high) pair of ints, got {max_new_tokens!r}"
        )
    if low < 1 or high < low:
        raise ValueError(
            f"max_new_tokens must allow at least 1 token (int >= 1, or (low, high) with "
            f"1 <= low < high), got {max_new_tokens!r}"
        )
    return low, high


@dataclass
class Task:
    """A game's content. Build one directly for a custom task, or register a factory."""

    name: str
    queries: Sequence[Query]
    reward_fn: RewardFn
    prompt_fn: PromptFn = continuation_prompt
    max_new_tokens: int | tuple[int, int] = 16
    context_length: int = 256
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queries = [q if isinstance(q, Query) else Query(str(q)) for q in self.queries]
        if not self.queries:
            raise ValueError(f"task {self.name!r} has an empty query set; give at least one query")
        if not callable(self.reward_fn):
            raise TypeError(
                f"task {self.name!r}: reward_fn must be callable, got {self.reward_fn!r}"
            )
        try:
            budget_range(self.max_new_tokens)
        except ValueError as err:
            raise ValueError(f"task {self.name!r}: {err}") from None

    def prompt(self, role: int, query: Query, earlier: Sequence[str]) -> str:
        return self.prompt_fn(role, query, earlier)

    def score(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        """Call the batched reward function once and check what it returned."""
        raw = self.reward_fn(queries, responses)
        try:
            scores = [float(s) for s in raw]
        except TypeError as err:
            raise TypeError(
                f"task {self.name!r}: reward function must return a sequence of numbers, "
                f"got {type(raw).__name__}"
            ) from err
        if len(scores) != len(responses):
            raise ValueError(
                f"task {self.name!r}: reward function returned {len(scores)} scores for "
                f"{len(responses)} responses; it must return exactly one score per response"
            )
        for row, value in enumerate(scores):
            if not math.isfinite(value):
                raise ValueError(
                    f"task {self.name!r}: reward function returned {value} for row {row} "
                    f"(response {responses[row]!r}); scores must be finite numbers"
                )
        return scores
