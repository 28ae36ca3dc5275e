"""What a task is: queries, one prompt template per role, a batched reward function."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


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
