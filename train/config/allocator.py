"""The heap allocator a training process runs on: mimalloc where it is installed.

Why: glibc's malloc keeps the memory of freed tensors resident but fragmented. Every
update frees and allocates gigabytes of activations, logits and gradients of many
sizes, and the holes add up, so the peak grows well past what is alive at once. Handing
freed memory back to the kernel instead (a low ``M_MMAP_THRESHOLD``) makes every fresh
page fault again. mimalloc reuses freed memory without fragmenting it. With purging off
(``MIMALLOC_PURGE_DELAY=-1``, set here unless the environment says otherwise) no page is
handed back and faulted in again; a run that trades time for memory
(``activation_checkpointing``) hands back pages left unused for 10 s instead
(``MIMALLOC_PURGE_DELAY=10000``). The measurements behind each choice are in
``docs/benchmarks.md`` ("The heap allocator").

An allocator must be loaded before the process starts (``LD_PRELOAD``). So the training
scripts, when run from the command line, re-execute their own command line once with it
(:func:`relaunch`): one explicit launcher step, before anything else runs. A call with
explicit arguments (a test, a notebook) keeps the allocator its process has. Nothing
computed changes: only where tensors live.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ALLOCATORS = ("auto", "mimalloc", "system")
"""``auto``: mimalloc when the ``cmeel-mimalloc`` package is installed (Linux), else the
system's; ``mimalloc``: required, an error without it; ``system``: never relaunch."""

OTHER_ALLOCATORS = ("jemalloc", "tcmalloc")
"""Allocators a user may preload; ``auto`` leaves them in place."""

RELAUNCHED = "CORY_ALLOCATOR_RELAUNCHED"
"""Set in the relaunched process, so that a library the loader refused cannot loop."""


def mimalloc_library() -> Path | None:
    """The shared library the ``cmeel-mimalloc`` wheel installs, if it is installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution("cmeel-mimalloc").locate_file("cmeel.prefix/lib/libmimalloc.so"))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


LEAN_PURGE_DELAY_MS = 10_000
"""How long mimalloc keeps an unused page when a run saves memory over time."""


def relaunch_environment(
    setting: str,
    environ: Mapping[str, str],
    library: Path | None,
    platform: str = sys.platform,
    lean: bool = False,
) -> dict[str, str] | None:
    """The environment to re-execute the process with, or None to carry on as it is.
    ``lean``: the run trades time for memory, so idle pages go back to the kernel."""
    if setting not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {list(ALLOCATORS)}, got {setting!r}")
    if setting == "system":
        return None
    if platform != "linux" or library is None:
        if setting == "mimalloc":
            raise RuntimeError(
                "allocator mimalloc needs Linux and the cmeel-mimalloc package "
                "(pip install cmeel-mimalloc); or set allocator auto or system"
            )
        return None
    preloaded = environ.get("LD_PRELOAD", "")
    if "libmimalloc" in preloaded or environ.get(RELAUNCHED):
        return None
    if setting == "auto" and any(other in preloaded for other in OTHER_ALLOCATORS):
        return None  # the user preloaded an allocator of their own
    env = dict(environ)
    env["LD_PRELOAD"] = f"{library} {preloaded}".strip()
    env.setdefault("MIMALLOC_PURGE_DELAY", str(LEAN_PURGE_DELAY_MS) if lean else "-1")
    env[RELAUNCHED] = "1"
    return env


def relaunch(setting: str, lean: bool = False) -> None:
    """Re-execute this process's own command line on mimalloc if ``setting`` asks for it
    and it is not loaded yet; otherwise return. Call it before any model is loaded."""
    env = relaunch_environment(setting, os.environ, mimalloc_library(), lean=lean)
    if env is None:
        if setting == "mimalloc" and in_use() != "mimalloc":
            raise RuntimeError(
                f"allocator mimalloc: the loader did not preload it (LD_PRELOAD="
                f"{os.environ.get('LD_PRELOAD', '')!r}); or set allocator auto or system"
            )
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def setting_in(flags: list[str], default: str = "auto") -> str:
    """The ``--allocator`` value among command-line training flags (a sweep passes them on)."""
    return flag_in(flags, "allocator") or default


def flag_in(flags: list[str], name: str) -> str | None:
    """The value of ``--name`` among command-line flags (``--name V`` or ``--name=V``)."""
    for i, flag in enumerate(flags):
        if flag.startswith(f"--{name}="):
            return flag.split("=", 1)[1]
        if flag == f"--{name}" and i + 1 < len(flags):
            return flags[i + 1]
    return None


def relaunch_for(flags: list[str]) -> None:
    """Settle the allocator from the command line before anything is parsed: re-execute
    on it now (:func:`relaunch`), so that parsing, validation and the learners' imports
    run once. ``--allocator`` and ``--activation_checkpointing`` are read from the flags;
    a config file's choice of them is not (their defaults hold)."""
    lean = (flag_in(flags, "activation_checkpointing") or "false").lower() in ("true", "1", "yes")
    relaunch(setting_in(flags), lean=lean)


def describe() -> str:
    """The allocator in use, with mimalloc's purge delay (how it treats freed pages)."""
    name = in_use()
    if name == "mimalloc":
        delay = os.environ.get("MIMALLOC_PURGE_DELAY", "10")  # mimalloc's own default
        return f"mimalloc (purge {'off' if delay == '-1' else f'after {delay} ms'})"
    return name


def in_use() -> str:
    """``mimalloc`` if it is loaded into this process, else ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return "mimalloc" if "libmimalloc" in maps else "system"
