"""The README's Python example (train, evaluate, export) runs as written, on a tiny model."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoModelForCausalLM

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_python_api_runs(tiny_model_dir, tmp_path, monkeypatch):
    text = README.read_text()
    [code] = re.findall(r"```python\n(from cory_rl import .*?)```", text, re.S)
    # the tiny model instead of the embedded one, to keep the suite quick; nothing else changes
    code = code.replace(
        'run_dir="runs/api"', f'run_dir="runs/api", model={tiny_model_dir!r}, device="cpu"'
    )
    assert tiny_model_dir in code, "the README's example changed: update this test"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md:python-api", "exec"), namespace)  # noqa: S102
    assert (tmp_path / "runs/api/eval.md").is_file() and namespace["report"]
    for agent in ("llm_0", "llm_1"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "exported/api" / agent)


def test_the_api_names_come_in_any_order_and_leave_the_train_package_alone():
    """Each name of ``cory_rl``'s API imports on its own, whatever was imported before,
    and ``cory_rl.train`` stays the package (a function of that name would shadow it)."""
    import importlib
    import subprocess
    import sys

    cory_rl = importlib.import_module("cory_rl")
    names = list(cory_rl.__all__)
    code = (
        f"from cory_rl import {', '.join(reversed(names))}\n"
        "import cory_rl, types\n"
        "assert isinstance(cory_rl.train, types.ModuleType), cory_rl.train\n"
        "import cory_rl.train.training.loop\n"
        "print(run_training.__module__, TrainConfig.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cory_rl.train.python_api", "TrainConfig"]
