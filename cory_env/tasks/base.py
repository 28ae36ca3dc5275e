"""What a task is: queries, one prompt template per role, a batched reward function.

The reward and prompt functions are the user's code: :meth:`Task.score` and
:meth:`Task.prompt` check what they return, and wrap what they raise, so that a mistake
there is reported with the function's name, the task and what came back.
"""

from __future__ import annotations

import functools
import math
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from cory_env import checks
from cory_env.query import PromptFn, Query, RewardFn

__all__ = [
    "PromptFn",
    "Query",
    "RewardFn",
    "Task",
    "TaskFunctionError",
    "budget_range",
    "continuation_prompt",
]


REWARD_LIMIT = 1e6
"""The largest score magnitude a reward may return: beyond it the learners' losses lose
their meaning (a value loss squares the score: 1e30 squared is inf in float32), and no
task's scale needs it."""


class TaskFunctionError(checks.UserError, RuntimeError):
    """A task's reward or prompt function raised; the original error is the ``__cause__``."""


def continuation_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """Plain continuation for every role (role and earlier answers ignored)."""
    return query.text


BUDGET_FORM = "an integer >= 1 or a (low, high) pair of integers with 1 <= low < high"


def budget_range(max_new_tokens: int | Sequence[int], where: str = "") -> tuple[int, int]:
    """Normalise a budget to ``(low, high)`` drawn as ``integers(low, high + 1)``.

    An int ``n`` is always ``n`` tokens; a pair ``(low, high)`` draws from ``low..high-1``
    per episode, like the paper's ``LengthSampler(4, 16)``.
    """
    value = max_new_tokens
    try:
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) != 2:
                raise checks.SettingError("not a pair")
            low = checks.integer(value[0], "low", minimum=1)
            high = checks.integer(value[1], "high", minimum=low + 1) - 1
            return low, high
        n = checks.integer(value, "max_new_tokens", minimum=1)
        return n, n
    except checks.SettingError:
        raise checks.fail(
            "max_new_tokens", BUDGET_FORM, value, where, "a pair draws a budget in low..high-1"
        ) from None


def callable_name(fn: Any) -> str:
    """How a user's function is named in messages: its qualified name, else its class."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxtuple = 6


def describe(value: Any) -> str:
    """Type (with shape or element types) and a short repr of what a user function returned."""
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (str, bytes)):
        kind += f" of shape {tuple(shape)}"
    elif isinstance(value, (list, tuple)) and value:
        kind += " of " + "/".join(sorted({type(v).__name__ for v in value}))
    return f"{kind} {_repr.repr(value)}"


LOCAL_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".parquet")
"""Dataset names that are local files (one split) rather than hub datasets."""


def is_local_file(dataset: Any) -> bool:
    return dataset is not None and Path(str(dataset)).suffix.lower() in LOCAL_SUFFIXES


@dataclass(frozen=True)
class HeldOut:
    """Where a task's evaluation queries come from: the task settings that select them, a
    note for the report, and whether training never draws them."""

    settings: dict[str, Any]
    note: str
    held_out: bool
    minus_training: bool = False
    """Drop evaluation queries whose text training also drew (generated problems)."""


def no_held_out_split(name: str, settings: dict[str, Any]) -> HeldOut:
    """A task that declares no test split is evaluated on its training queries, and says so."""
    return HeldOut(
        dict(settings), f"task {name!r} has no known test split: training queries", False
    )


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
    referee: Any = None
    """A :class:`cory_env.referee.Referee` whose matches' rules play the game (TextArena):
    prompts are their observations, answers their moves, results the scores; None = the
    prompt function and the reward function."""

    def __post_init__(self) -> None:
        checks.text(self.name, "name", where="Task")
        where = f"task {self.name!r}"
        self.queries = _as_queries(self.queries, where)
        if not self.queries:
            raise ValueError(f"{where} has an empty query set; give at least one query")
        for attr in ("reward_fn", "prompt_fn"):
            fn = getattr(self, attr)
            if not callable(fn):
                raise TypeError(f"{where}: {attr} must be callable, got {describe(fn)}")
        budget_range(self.max_new_tokens, where)
        self.context_length = checks.integer(
            self.context_length, "context_length", minimum=2, where=where
        )
        if not isinstance(self.metadata, dict):
            raise TypeError(f"{where}: metadata must be a dict, got {describe(self.metadata)}")

    def prompt(self, role: int, query: Query, earlier: Sequence[str]) -> str:
        """The prompt text for ``role``, checked to be text."""
        try:
            text = self.prompt_fn(role, query, earlier)
        except Exception as err:
            raise TaskFunctionError(
                f"task {self.name!r}: prompt function {callable_name(self.prompt_fn)} raised "
                f"{type(err).__name__} for role {role}: {err}"
            ) from err
        if not isinstance(text, str):
            raise TypeError(
                f"task {self.name!r}: prompt function {callable_name(self.prompt_fn)} must "
                f"return a str (the prompt text), got {describe(text)}"
            )
        return text

    def score(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        """Call the batched reward function once and check what it returned."""
        fn = callable_name(self.reward_fn)
        try:
            raw = self.reward_fn(queries, responses)
        except checks.UserError:
            raise  # it names its function or server already (a reward server down)
        except Exception as err:
            raise TaskFunctionError(
                f"task {self.name!r}: reward function {fn} raised {type(err).__name__}: {err}"
            ) from err
        n = len(responses)
        expected = f"one finite float per response (a sequence of length {n})"
        scores = _as_floats(raw)
        if isinstance(scores, str):  # what was wrong
            raise checks.RewardOutputError(
                f"task {self.name!r}: reward function {fn} must return {expected}, got {scores}"
            )
        if len(scores) != n:
            raise checks.RewardOutputError(
                f"task {self.name!r}: reward function {fn} returned {len(scores)} scores for "
                f"{n} responses; it must return {expected}"
            )
        for row, value in enumerate(scores):
            if not math.isfinite(value):
                raise checks.RewardOutputError(
                    f"task {self.name!r}: reward function {fn} returned {value} for row {row} "
                    f"(response {responses[row]!r}); it must return {expected}"
                )
            if abs(value) > REWARD_LIMIT:
                raise checks.RewardOutputError(
                    f"task {self.name!r}: reward function {fn} returned {value:g} for row {row} "
                    f"(response {responses[row]!r}); scores beyond +-{REWARD_LIMIT:g} "
                    "(cory_env.tasks.base.REWARD_LIMIT) break the learners' losses: rescale "
                    "them (a few units either side of 0 is the usual scale)"
                )
        return scores


def _as_queries(queries: Any, where: str) -> list[Query]:
    """Queries as a list of :class:`Query`; texts become queries, anything else is refused."""
    if isinstance(queries, (str, bytes, Mapping)) or not isinstance(queries, (Sequence, Iterator)):
        raise TypeError(f"{where}: queries must be a list of str or Query, got {describe(queries)}")
    out = []
    for i, q in enumerate(queries):
        if isinstance(q, Query):
            out.append(q)
        elif isinstance(q, str):
            out.append(Query(q))
        else:
            raise TypeError(
                f"{where}: queries must be a list of str or Query, but query {i} is {describe(q)}"
            )
    return out


def _item(value: Any) -> Any:
    """A 0-d array or tensor (``np.float32(1)``, ``torch.tensor(1.0)``) as a Python number."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def _as_floats(raw: Any) -> list[float] | str:
    """``raw`` as a list of floats, or a description of why it is not one number per row.

    Accepted: a list, tuple or iterator of real numbers (0-d arrays and tensors included),
    or a 1-d array or tensor. Refused: text (``"1111"`` is not four scores), mappings,
    sets, scalars and anything nested (a ``(B, 1)`` array is not ``B`` scores).
    """
    shape = getattr(raw, "shape", None)
    if shape is not None and hasattr(raw, "tolist") and not isinstance(raw, (str, bytes)):
        if len(tuple(shape)) != 1:
            return describe(raw)
        items = raw.tolist()
    elif isinstance(raw, (Sequence, Iterator)) and not isinstance(raw, (str, bytes)):
        items = list(raw)
    else:
        return describe(raw)
    values = []
    for row, item in enumerate(items):
        value = _item(item)
        if not isinstance(value, Real):
            return f"{describe(raw)} whose row {row} is {describe(item)}"
        values.append(float(value))
    return values


def select_count(task: str, available: int, n_queries: int | None) -> int:
    """How many queries to keep: all when ``n_queries`` is None, else check it fits."""
    if n_queries is None:
        return available
    where = f"task {task!r}"
    n_queries = checks.integer(n_queries, "n_queries", minimum=1, where=where)
    if n_queries > available:
        raise checks.fail(
            "n_queries", f"at most the {available} queries available", n_queries, where
        )
    return n_queries
