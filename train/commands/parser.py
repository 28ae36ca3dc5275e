"""The command-line parser of every script: a mistake is one line, not a screen of usage.

argparse prints the whole usage block (for training, about 40 lines of flags) above the
one line that says what was wrong. Here an error prints that line and where to read the
options, for training, evaluation, sweeps, export, comparison and plots alike.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn


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
