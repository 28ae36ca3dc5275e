"""Every bench script's ``--smoke`` (bench/smoke.py): the same path as a real run at its
smallest setting, on a tiny random model, run as its command line runs it (a process of its
own, from the repository's root) and printing its result.

The scripts are found in bench/, so a new one without a smoke mode fails here, as does one
whose result is not named in ``RESULT``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path.name for path in (ROOT / "bench").glob("bench_*.py"))

RESULT = {
    "bench_cross_play_memory.py": [r"^total peak, 6 pairs / 3 pairs: \S+x$"],
    "bench_engine.py": [r"^imdb +3 +\S+ +\S+ +\S+x"],
    "bench_env.py": [r"^bookkeeping/generation = ", r"^scoring/generation = "],
    "bench_kl_cost.py": [r"^learn, full / full_in_reward: \S+x$", r"^peak memory, full / "],
    "bench_prefix.py": [r"^learn, without / with sharing: \S+x$", r"largest relative difference"],
    "bench_sharding.py": [r"^FSDP2 / DDP: weights and moments held per process \S+x"],
    "bench_sweep_memory.py": [r"^\S*seed\S* \| \d+ \| \d+$"],
    "bench_train.py": [r"^SUMMARY cory: \S+ s/iteration", r"^SUMMARY ppo: \S+ s/iteration"],
    "bench_trl.py": [r"^ours grpo ", r"^TRL GRPOTrainer ", r"^TRL RLOOTrainer ", r"ours/TRL +\S+x"],
    "bench_trl_phases.py": [r"^  step .* ours/TRL \S+x$", r"^  floor at \S+ GFLOP/s"],
}
"""Per script, the lines (regular expressions) its smoke run prints: its result."""

NEEDS = {"bench_engine.py": "vllm"}
"""Scripts that need an optional package, skipped without it."""

SLOW = {
    "bench_cross_play_memory.py",
    "bench_kl_cost.py",
    "bench_sharding.py",
    "bench_sweep_memory.py",
    "bench_train.py",
    "bench_trl.py",
    "bench_trl_phases.py",
}
"""Smoke runs of more than about 30 s on 2 CPU cores (several processes each): marked
``bench`` (.ci/run runs them); the others, 10-20 s each, are ``slow`` (the README's second
test command)."""


def scripts() -> list:
    return [
        pytest.param(
            name, marks=[pytest.mark.bench if name in SLOW else pytest.mark.slow], id=name[:-3]
        )
        for name in SCRIPTS
    ]


@pytest.mark.parametrize("script", scripts())
def test_smoke_mode_runs_and_prints_its_result(script):
    assert script in RESULT, f"bench/{script}: name the lines its --smoke prints in RESULT"
    package = NEEDS.get(script)
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"bench/{script} needs {package}, which is not installed")
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{script.removesuffix('.py')}", "--smoke"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"bench/{script} --smoke failed:\n{output}"
    for pattern in RESULT[script]:
        assert re.search(pattern, done.stdout, re.MULTILINE), f"no {pattern!r}:\n{output}"


def test_every_script_is_named():
    """RESULT names no script that is gone."""
    assert sorted(RESULT) == SCRIPTS


def test_scripts_run_as_modules_without_path_edits():
    """``python -m bench.X`` finds the package ``bench``: no script puts the checkout on
    ``sys.path``, and the README, docs and CI name the module form."""
    for path in (ROOT / "bench").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "sys.path.insert(0" not in source, f"bench/{path.name} edits sys.path"
    pages = [ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").glob("*.md")]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"python3? bench/", text), f"{page.name}: python -m bench.X"
