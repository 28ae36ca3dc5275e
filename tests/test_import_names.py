"""The installed project puts no top-level ``agents`` or ``train`` into the environment:
beside packages that own those names, both theirs and ours import and work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import importlib.util, agents, train
assert agents.OWNER == "someone else" and train.OWNER == "someone else"
import cory_env
from cory_rl.agents.registry import available_learners
from cory_rl.train.config.resolve import build_config
from cory_rl.train.training.run import run_training
assert "ppo" in available_learners()
assert build_config("smoke", algorithm="cory").algorithm == "cory"
import cory_rl.agents, cory_rl.train
for name in ("agents", "train"):
    assert not importlib.util.find_spec(name).origin.startswith(ROOT), name
print("both")
"""


def test_the_project_imports_beside_packages_named_agents_and_train(tmp_path):
    others = tmp_path / "site"
    for name in ("agents", "train"):
        (others / name).mkdir(parents=True)
        (others / name / "__init__.py").write_text('OWNER = "someone else"\n')
    env = {**os.environ, "PYTHONPATH": str(others)}
    code = f"ROOT = {str(ROOT)!r}\n{CHECK}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "both"


def test_the_installed_project_has_no_top_level_agents_or_train(tmp_path):
    """Away from the checkout (whose folders would be on the path), neither name exists."""
    code = "import importlib.util as u; print(u.find_spec('agents'), u.find_spec('train'))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "None None", done.stdout + done.stderr
