"""Files written whole: a reader, or a crash, never meets half a file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_beside(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` into a file beside ``path``, then move it into place: a reader, or a
    crash, never meets half a file, and the previous one stays whole until the new one is."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: Path, text: str) -> Path:
    """:func:`write_beside` for text."""
    return write_beside(path, lambda tmp: tmp.write_text(text))
