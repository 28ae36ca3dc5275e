"""Task registry: a new task is one file that registers a factory by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from cory_env.tasks.base import PromptFn, Query, RewardFn, Task, continuation_prompt

TaskFactory = Callable[..., Task]
_REGISTRY: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator: ``@register_task("mytask") def make(**settings) -> Task``."""

    def wrap(factory: TaskFactory) -> TaskFactory:
        _REGISTRY[name] = factory
        return factory

    return wrap


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


def make_task(name: str, **settings: Any) -> Task:
    """Build a registered task; unknown names or settings raise a clear error."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown task {name!r}; registered tasks are {available_tasks()}. "
            "For your own queries and reward use cory_env.custom_task(queries, reward_fn)."
        )
    try:
        return _REGISTRY[name](**settings)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise ValueError(f"task {name!r}: {err}") from err
        raise


def task_takes(name: str, setting: str) -> bool:
    """Whether the registered factory ``name`` accepts the keyword ``setting``."""
    factory = _REGISTRY.get(name)
    return factory is not None and setting in inspect.signature(factory).parameters


def custom_task(
    queries: list[str] | list[Query],
    reward_fn: RewardFn,
    prompt_fn: PromptFn = continuation_prompt,
    name: str = "custom",
    **kwargs: Any,
) -> Task:
    """A user's own queries plus a batched ``reward_fn(queries, responses)``."""
    return Task(
        name=name, queries=list(queries), reward_fn=reward_fn, prompt_fn=prompt_fn, **kwargs
    )


# Importing the task modules registers them.
from cory_env.tasks import arith, gsm8k, imdb  # noqa: E402,F401

__all__ = [
    "Query",
    "RewardFn",
    "PromptFn",
    "Task",
    "available_tasks",
    "custom_task",
    "make_task",
    "register_task",
    "task_takes",
]
