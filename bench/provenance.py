"""Which code a bench measured, printed beside its figures so that each names its commit.

Nothing here imports torch or the project: a bench's parent process may use it without
loading what its measured processes load.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout the bench scripts belong to."""


def _git(arguments: list[str], checkout: Path | str | None) -> str:
    """git's output in ``checkout`` (OSError without git)."""
    done = subprocess.run(["git", *arguments], cwd=checkout, capture_output=True, text=True)
    return done.stdout


def commit(checkout: Path | str | None = None) -> str:
    """The short hash of ``checkout``'s HEAD (default: the working folder's); empty outside
    a git checkout or without git."""
    try:
        return _git(["rev-parse", "--short", "HEAD"], checkout).strip()
    except OSError:
        return ""


def code_version() -> str:
    """The commit measured, and whether agents/, train/ or cory_env/ differ from it."""
    try:
        head = _git(["rev-parse", "--short", "HEAD"], ROOT).strip()
        dirty = _git(["status", "--porcelain", "--", "agents", "train", "cory_env"], ROOT).split()
    except OSError:
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes to " + ", ".join(dirty[1::2]) if dirty else "")
