"""Task registry: a new task is one file that registers a factory by name.

What the game needs to know about a task factory is declared when it is registered
(``needs_tokenizer``), not guessed from the factory's signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cory_env import checks
from cory_env.plugins import TASKS, load_plugins
from cory_env.tasks.base import HeldOut, Task, no_held_out_split
from cory_env.user_rewards import try_user_reward

TaskFactory = Callable[..., Task]
HeldOutFn = Callable[[dict[str, Any]], HeldOut]


@dataclass(frozen=True)
class TaskEntry:
    """A registered factory and what it asks of the game."""

    factory: TaskFactory
    needs_tokenizer: bool = False
    """The game passes ``tokenizer=`` (the pioneer seat's) unless the user gave one."""
    held_out: HeldOutFn | None = None
    """``settings -> HeldOut``: the settings of the task's evaluation queries (its test
    split); None = no split (evaluation says it uses training queries)."""


_REGISTRY: dict[str, TaskEntry] = {}


def register_task(
    name: str,
    *,
    needs_tokenizer: bool = False,
    held_out: HeldOutFn | None = None,
    replace: bool = False,
) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator: ``@register_task("mytask") def make(**settings) -> Task``.

    ``needs_tokenizer=True``: the factory takes a ``tokenizer`` keyword and the game
    gives it the pioneer seat's tokenizer (e.g. to cut queries to their first k tokens).
    ``held_out(settings) -> HeldOut`` names the settings of the queries evaluation uses
    (e.g. ``{**settings, "split": "test"}``). A name already taken by another factory is
    refused unless ``replace=True``.
    """
    checks.text(name, "name", where="register_task", hint="use @register_task('name')")
    needs_tokenizer = checks.boolean(needs_tokenizer, "needs_tokenizer", where="register_task")
    replace = checks.boolean(replace, "replace", where="register_task")

    def wrap(factory: TaskFactory) -> TaskFactory:
        if not callable(factory):
            raise TypeError(f"register_task({name!r}) decorates a task factory, got {factory!r}")
        checks.free_name(_REGISTRY, name, factory, "task", replace, lambda e: e.factory)
        _REGISTRY[name] = TaskEntry(factory, needs_tokenizer, held_out)
        return factory

    return wrap


def available_tasks() -> list[str]:
    load_plugins(TASKS)
    return sorted(_REGISTRY)


def _entry(name: str) -> TaskEntry:
    if isinstance(name, str) and name not in _REGISTRY:
        load_plugins(TASKS, name)  # a task of an installed package of one's own
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(
            f"unknown task {name!r}; registered tasks are {available_tasks()}. "
            "For your own queries and reward use cory_env.custom_task(queries, reward_fn)."
        )
    return _REGISTRY[name]


def task_needs_tokenizer(name: str) -> bool:
    """Whether the registered task ``name`` wants the game's tokenizer (see register_task)."""
    return _entry(name).needs_tokenizer


def held_out_split(name: str, settings: Mapping[str, Any]) -> HeldOut:
    """The evaluation queries of task ``name`` trained with ``settings`` (its test split)."""
    held_out = _entry(name).held_out
    return no_held_out_split(name, dict(settings)) if held_out is None else held_out(dict(settings))


def task_settings_of(name: str) -> list[str] | None:
    """The settings the task ``name``'s factory takes (None: it takes any keyword)."""
    entry = _entry(name)
    parameters = inspect.signature(entry.factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sorted(p.name for p in parameters if p.kind in kinds)


def check_task_settings(name: str, settings: Mapping[str, Any]) -> None:
    """Refuse an unknown task or a setting its factory does not take, naming the ones it
    does, before anything is built (``checks.SettingError``)."""
    try:
        known = task_settings_of(name)
    except ValueError as err:
        raise checks.SettingError(f"task: {err}") from None
    unknown = [] if known is None else sorted(set(settings) - set(known))
    if unknown:
        raise checks.SettingError(
            f"task_settings: task {name!r} has no settings {unknown}; its settings are {known}"
        )


def make_task(name: str, **settings: Any) -> Task:
    """Build a registered task; unknown names or settings raise a clear error."""
    factory = _entry(name).factory
    known = task_settings_of(name)
    unknown = [] if known is None else sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(f"task {name!r} has no settings {unknown}; its settings are {known}")
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
    try_user_reward(task)  # wrong or failing: said now, before any model loads
    return task
