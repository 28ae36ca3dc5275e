"""Tasks: queries, per-role prompts and a batched reward, registered by name.

A new task is one file in this folder that registers a factory with
:func:`register_task`: importing this package imports every module in it (as ``agents/``'s
learners are found, ``cory_env.plugins.import_package_modules``), so dropping the file here
is all it takes. A task of one's own package: its ``cory.tasks`` entry point, or
``--import my_package.tasks`` (``cory_env/plugins.py``).
"""

from __future__ import annotations

import sys
from typing import Any

from cory_env.plugins import import_package_modules
from cory_env.tasks.base import (
    HeldOut,
    PromptFn,
    Query,
    RewardFn,
    Task,
    TaskFunctionError,
    continuation_prompt,
)
from cory_env.tasks.registry import (
    available_tasks,
    check_task_settings,
    held_out_split,
    make_task,
    register_task,
    task_needs_tokenizer,
)


def custom_task(
    queries: list[str] | list[Query],
    reward_fn: RewardFn,
    prompt_fn: PromptFn = continuation_prompt,
    name: str = "custom",
    **kwargs: Any,
) -> Task:
    """A user's own queries plus a batched ``reward_fn(queries, responses)``."""
    return Task(name=name, queries=queries, reward_fn=reward_fn, prompt_fn=prompt_fn, **kwargs)


# Every module of this folder, imported: each registers its tasks (no list to keep).
import_package_modules(sys.modules[__name__])

__all__ = [
    "HeldOut",
    "PromptFn",
    "Query",
    "RewardFn",
    "Task",
    "TaskFunctionError",
    "available_tasks",
    "check_task_settings",
    "custom_task",
    "held_out_split",
    "make_task",
    "register_task",
    "task_needs_tokenizer",
]
