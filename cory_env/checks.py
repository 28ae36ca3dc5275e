"""One set of setting checks, one message style, for the game, the tasks and the training config.

Every check returns the value in its canonical type or raises :class:`SettingError` with
``"<where>: <name> must be <what>, got <value>"``, so a bad setting fails before any work
and says what was wrong. ``bool`` is never accepted where a number is meant (``True`` is
an ``int`` to Python, but ``role_exchange_period=True`` is a mistake, not a 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from typing import Any


class UserError(Exception):
    """A mistake in what the user gave: a setting, a data file, a reward function or
    server, a checkpoint. The message names it and says what to do, so a command prints it
    as one line, without a traceback (the errors of the library's own code keep theirs)."""


class SettingError(UserError, ValueError):
    """A setting has the wrong type or range; the message names it and the value."""


class DataError(UserError, ValueError):
    """A data file or data set that cannot be used; the message names it and the place."""


class RewardError(UserError, RuntimeError):
    """A reward function or server failed: it raised, could not be reached or loaded."""


class RewardOutputError(UserError, ValueError):
    """A reward function or server returned something other than one finite score per
    answer."""


def fail(name: str, what: str, value: Any, where: str = "", hint: str = "") -> SettingError:
    """The error for a bad setting, in the one message style (returned, for ``raise``)."""
    prefix = f"{where}: " if where else ""
    tail = f" ({hint})" if hint else ""
    return SettingError(f"{prefix}{name} must be {what}, got {value!r}{tail}")


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, Integral) else f"{x:g}"


def _bounds(minimum: float | None, maximum: float | None, exclusive_min: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if exclusive_min else '>='} {_fmt(minimum)}")
    if maximum is not None:
        parts.append(f"<= {_fmt(maximum)}")
    return " and ".join(parts)


def integer(
    value: Any,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    where: str = "",
    hint: str = "",
) -> int:
    """An integer (an integral float such as ``1e3`` is accepted as 1000) within bounds."""
    bounds = _bounds(minimum, maximum, False)
    what = "an integer" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool):
        raise fail(name, what, value, where, hint)
    if isinstance(value, Integral):
        out = int(value)
    elif isinstance(value, Real) and math.isfinite(value) and float(value).is_integer():
        out = int(value)
    else:
        raise fail(name, what, value, where, hint)
    if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
        raise fail(name, what, value, where, hint)
    return out


def number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_min: bool = False,
    where: str = "",
    hint: str = "",
) -> float:
    """A finite real number within bounds (``exclusive_min``: strictly above ``minimum``)."""
    bounds = _bounds(minimum, maximum, exclusive_min)
    what = "a finite number" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise fail(name, what, value, where, hint)
    out = float(value)
    too_low = minimum is not None and (out <= minimum if exclusive_min else out < minimum)
    if too_low or (maximum is not None and out > maximum):
        raise fail(name, what, value, where, hint)
    return out


def boolean(value: Any, name: str, *, where: str = "", hint: str = "") -> bool:
    """``True`` or ``False`` only: ``1`` or ``"yes"`` are refused, not guessed at."""
    if not isinstance(value, bool):
        raise fail(name, "true or false", value, where, hint)
    return value


def choice(value: Any, name: str, choices: Iterable[Any], *, where: str = "") -> Any:
    """One of ``choices``."""
    options = list(choices)
    if isinstance(value, bool) or value not in options:
        raise fail(name, f"one of {options}", value, where)
    return value


def text(value: Any, name: str, *, where: str = "", hint: str = "") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise fail(name, "a non-empty string", value, where, hint)
    return value


def free_name(
    registry: Mapping[str, Any],
    name: str,
    factory: Any,
    kind: str,
    replace: bool,
    registered: Any = None,
) -> None:
    """Refuse registering ``factory`` under a ``name`` that another factory holds, unless
    ``replace``. The same function registered again (a reloaded module makes a new object
    of the same module and name) is not a duplicate. ``registered`` gets the holder's
    factory from a registry entry (default: the entry itself)."""

    def key(f: Any) -> tuple[Any, Any]:
        return getattr(f, "__module__", None), getattr(f, "__qualname__", id(f))

    if name not in registry or replace:
        return
    old = registry[name] if registered is None else registered(registry[name])
    if old is factory or key(old) == key(factory):
        return
    holder = getattr(old, "__qualname__", repr(old))
    raise ValueError(
        f"{kind} {name!r} is already registered (by {holder}); choose another name or pass "
        "replace=True"
    )


def plain_numbers(settings: Any) -> None:
    """Give a dataclass's numbers the type its fields declare, in place, at construction:
    ``2`` or a numpy float for a float field becomes a float, an integral ``1e3`` or a numpy
    integer for an int field an int (YAML reads ``1e3`` as a float). Anything else
    (a bool, a string, ``2.5`` for an int) is left for ``validate`` to refuse."""
    import dataclasses

    for f in dataclasses.fields(settings):
        value, kind = getattr(settings, f.name), str(f.type)
        if isinstance(value, bool):
            continue
        if kind in ("float", "float | None") and isinstance(value, Real):
            if type(value) is not float:  # an int, a numpy number
                object.__setattr__(settings, f.name, float(value))
        elif kind in ("int", "int | None") and type(value) is not int:
            integral = isinstance(value, Integral) or (
                isinstance(value, Real) and math.isfinite(value) and float(value).is_integer()
            )
            if integral:  # a numpy integer, an integral float such as 1e3
                object.__setattr__(settings, f.name, int(value))
