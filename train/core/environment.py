"""Where a run ran: its machine, packages, code and reward build, one line per start.

A run's numbers depend on more than its config. A processor without bf16 instructions
emulates bf16 ten times slower; the same fp32 computation rounds differently on AVX2 and
on AVX-512 kernels, and on 1 and 2 threads; a reward built on the machine (the IMDB
classifier) is rebuilt where its cache is missing, the same only to float rounding. A run
folder's ``environment.jsonl`` gets one line each time the run starts or resumes, so that
a committed result says where each stretch of it was computed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from cory_rl.train.core.build import cpu_has_bf16
from cory_rl.train.core.results import ENVIRONMENT_FILE

PACKAGES = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "vllm", "cory")
"""The packages whose versions a line names (those installed)."""
CODE_ROOT = Path(__file__).resolve().parents[2]
"""The folder ``train/`` lives in: a git checkout for an editable install."""


def processor_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def code_commit(root: Path = CODE_ROOT) -> str | None:
    """``git describe --always --dirty`` of the code's checkout; None outside one."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def reward_provenance(game: Any) -> dict[str, Any] | None:
    """What the game's reward says it was built from (``provenance()``, e.g. the IMDB
    classifier's build record); None for a reward without one."""
    task = getattr(game, "task", None)
    provenance = getattr(getattr(task, "reward_fn", None), "provenance", None)
    return provenance() if callable(provenance) else None


def describe(iteration: int, game: Any = None) -> dict[str, Any]:
    """This process's line: when, from which iteration, on what, with which code."""
    line: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "iteration": iteration,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.machine()}",
        "processor": processor_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": cpu_has_bf16(),
        "torch_threads": torch.get_num_threads(),
        "cuda": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "versions": _versions(),
        "code": code_commit(),
    }
    reward = reward_provenance(game)
    if reward is not None:
        line["reward"] = reward
    return line


def record_environment(run_path: Path, iteration: int, game: Any = None) -> dict[str, Any]:
    """Append this start's line to ``run_path/environment.jsonl``; the line."""
    line = describe(iteration, game)
    with open(Path(run_path) / ENVIRONMENT_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return line


def read_environment(run_path: Path) -> list[dict[str, Any]]:
    """The lines of a run folder's ``environment.jsonl`` (none for an older run)."""
    path = Path(run_path) / ENVIRONMENT_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
