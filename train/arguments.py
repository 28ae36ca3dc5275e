"""The command-line parser of every script: a mistake is one line, not a screen of usage.

argparse prints the whole usage block (for training, about 40 lines of flags) above the
one line that says what was wrong. Here an error prints that line and where to read the
options, for training, evaluation, sweeps, export, comparison and plots alike.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are the message and a pointer to ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help for the options)\n")
