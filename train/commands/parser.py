"""The command-line parser of every script: a mistake is one line, not a screen of usage.

argparse prints the whole usage block (for training, about 40 lines of flags) above the
one line that says what was wrong. Here an error prints that line and where to read the
options, for training, evaluation, sweeps, export, comparison and plots alike.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

Main = TypeVar("Main", bound=Callable[..., Any])


def summary(doc: str | None) -> str:
    """A module docstring's first paragraph as one line: the description ``--help`` prints,
    whole even where the sentence wraps in the source."""
    return " ".join((doc or "").split("\n\n")[0].split())


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are the message and a pointer to ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help for the options)\n")


def number_at_least(
    minimum: float, *, integer: bool = False, above: bool = False
) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number at least (``above``: more than) ``minimum``,
    so that ``--at_kl -5`` or ``--max_new_tokens 0`` stops at parsing, before any work."""
    kind = "an integer" if integer else "a number"
    bound = f"{'above' if above else 'at least'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not math.isfinite(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"{text} is not {kind} {bound}")
        return value

    parse.__name__ = kind.split()[-1]  # argparse names the type in its messages
    return parse


def non_empty_text(text: str) -> str:
    """An argparse ``type`` for text with something in it (``--query ""`` is refused)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give a few words")
    return text


def existing_folder(text: str) -> Path:
    """An argparse ``type`` for a folder that is there and readable, so that a mistyped
    path stops at parsing in one line, not in a traceback after the work has begun."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: a folder this user cannot read")
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type`` for a folder to write: refused when it is a file, or when the
    nearest part of it that is there is a file or a folder this user cannot write."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder to write into")
    there = next(p for p in (path, *path.parents) if p.exists())  # '.' or '/' at last
    if not there.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {there} is a file, not a folder")
    if not os.access(there, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: this user cannot write in {there}")
    return path


def path_errors_in_one_line(main: Main) -> Main:
    """A command's ``main`` whose file-system errors on a path (missing, unreadable, a file
    where a folder should be) end in one line naming the path, not a traceback."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except OSError as err:
            if err.filename is None and not isinstance(err, FileNotFoundError):
                raise  # not a path's: the library's own error keeps its traceback
            ArgumentParser(prog=Path(sys.argv[0]).name).error(path_message(err))

    return run  # type: ignore[return-value]


def path_message(err: OSError) -> str:
    """``PATH: what is wrong`` of a file-system error, or its own message."""
    if err.filename is None or not err.strerror:
        return str(err)
    return f"{err.filename}: {err.strerror[:1].lower()}{err.strerror[1:]}"
