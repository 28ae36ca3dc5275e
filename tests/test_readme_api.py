"""The README's Python example (train, evaluate, export) runs as written, on a tiny model."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoModelForCausalLM

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_python_api_runs(tiny_model_dir, tmp_path, monkeypatch):
    text = README.read_text()
    [code] = re.findall(
        r"```python\n(from cory_rl\.train\.evaluator import evaluate_run\n.*?)```", text, re.S
    )
    # the tiny model instead of the embedded one, to keep the suite quick; nothing else changes
    code = code.replace('overrides={"run_dir": "runs/api"}',
                        f'overrides={{"run_dir": "runs/api", "model": {tiny_model_dir!r}, '
                        '"device": "cpu"}')  # fmt: skip
    assert tiny_model_dir in code, "the README's example changed: update this test"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md:python-api", "exec"), namespace)  # noqa: S102
    assert (tmp_path / "runs/api/eval.md").is_file() and namespace["report"]
    for agent in ("llm_0", "llm_1"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "exported/api" / agent)
