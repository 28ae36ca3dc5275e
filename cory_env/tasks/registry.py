"""Task registry: a new task is one file that registers a factory by name.

What the game needs to know about a task factory is declared when it is registered
(``needs_tokenizer``), not guessed from the factory's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cory_env import checks
from cory_env.tasks.base import Task

TaskFactory = Callable[..., Task]


@dataclass(frozen=True)
class TaskEntry:
    """A registered factory and what it asks of the game."""

    factory: TaskFactory
    needs_tokenizer: bool = False
    """The game passes ``tokenizer=`` (the pioneer seat's) unless the user gave one."""


_REGISTRY: dict[str, TaskEntry] = {}


def register_task(
    name: str, *, needs_tokenizer: bool = False, replace: bool = False
) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator: ``@register_task("mytask") def make(**settings) -> Task``.

    ``needs_tokenizer=True``: the factory takes a ``tokenizer`` keyword and the game
    gives it the pioneer seat's tokenizer (e.g. to cut queries to their first k tokens).
    A name already taken by another factory is refused unless ``replace=True``.
    """
    checks.text(name, "name", where="register_task", hint="use @register_task('name')")
    needs_tokenizer = checks.boolean(needs_tokenizer, "needs_tokenizer", where="register_task")
    replace = checks.boolean(replace, "replace", where="register_task")

    def wrap(factory: TaskFactory) -> TaskFactory:
        if not callable(factory):
            raise TypeError(f"register_task({name!r}) decorates a task factory, got {factory!r}")
        checks.free_name(_REGISTRY, name, factory, "task", replace, lambda e: e.factory)
        _REGISTRY[name] = TaskEntry(factory, needs_tokenizer)
        return factory

    return wrap


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


def _entry(name: str) -> TaskEntry:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(
            f"unknown task {name!r}; registered tasks are {available_tasks()}. "
            "For your own queries and reward use cory_env.custom_task(queries, reward_fn)."
        )
    return _REGISTRY[name]


def task_needs_tokenizer(name: str) -> bool:
    """Whether the registered task ``name`` wants the game's tokenizer (see register_task)."""
    return _entry(name).needs_tokenizer


def make_task(name: str, **settings: Any) -> Task:
    """Build a registered task; unknown names or settings raise a clear error."""
    factory = _entry(name).factory
    try:
        task = factory(**settings)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise ValueError(f"task {name!r}: {err}") from err
        raise
    if not isinstance(task, Task):
        raise TypeError(
            f"task {name!r}: its factory {getattr(factory, '__qualname__', factory)!r} "
            f"must return a Task, got {type(task).__name__}"
        )
    return task
