"""Setting checks shared by the task factories, so bad settings fail early and clearly."""

from __future__ import annotations

from typing import Any


def positive_int(task: str, name: str, value: Any) -> int:
    """``value`` if it is an int >= 1 (bools refused), else a ValueError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"task {task!r}: {name} must be a positive int, got {value!r}")
    return value


def optional_positive_int(task: str, name: str, value: Any) -> int | None:
    return None if value is None else positive_int(task, name, value)


def select_count(task: str, available: int, n_queries: int | None) -> int:
    """How many queries to keep: all when ``n_queries`` is None, else check it fits."""
    if n_queries is None:
        return available
    positive_int(task, "n_queries", n_queries)
    if n_queries > available:
        raise ValueError(
            f"task {task!r}: n_queries={n_queries} but only {available} queries are available"
        )
    return n_queries
