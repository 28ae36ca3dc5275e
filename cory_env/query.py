"""The unit of a task's data, in a leaf module so that tasks and rewards can both import it.

Neither :mod:`cory_env.tasks` nor :mod:`cory_env.rewards` is imported here, which is
what keeps the two free of an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    """One query of a task. ``answer`` is the gold answer where the task has one.

    Both fields are text: an answer given as a number (``answer=42``) is refused rather
    than turned into a string here, because ``str(0.1 + 0.2)`` is not the answer meant.
    """

    text: str
    answer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(
                f"Query: text must be a str, got {type(self.text).__name__} {self.text!r}"
            )
        if self.answer is not None and not isinstance(self.answer, str):
            raise TypeError(
                f"Query: answer must be a str or None, got {type(self.answer).__name__} "
                f"{self.answer!r} (give a number as text, e.g. '42')"
            )


RewardFn = Callable[[Sequence[Query], Sequence[str]], Sequence[float]]
"""Batched reward: ``reward_fn(queries, responses) -> one score per pair``."""

PromptFn = Callable[[int, Query, Sequence[str]], str]
"""``prompt_fn(role, query, earlier_responses) -> prompt text``; role 0 is the pioneer.

``earlier_responses`` are the answers the game's ``sees`` setting lets ``role`` see, in
role order: role r-1's alone (``"previous"``, the default), those of roles 0..r-1
(``"all"``); with ``"none"`` every agent is asked for role 0's prompt with no answers.
A template should render every answer it is given.
"""
