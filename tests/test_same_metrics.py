"""Speed work must not change what is computed: a seeded CORY run on a tiny model logs the
metrics that the code logged before the speed-ups, within floating-point tolerance.

The reference file was written by ``metrics_of_a_seeded_run`` at commit 3754a73, before
the update grouped rows by length, the LM head was fed contiguous positions and the
repetition penalty became sparse. The run samples with the official penalty (1.1), in
micro-batches larger than ``forward_batch_size`` and with responses of varying length, so
every one of those paths is exercised. Regenerate only for a change that is meant to
change the numbers, and say so in its commit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.conftest import read_jsonl, tiny_config

REFERENCE = Path(__file__).parent / "data" / "metrics_before_speedups.json"


def metrics_of_a_seeded_run(model_dir: str, run_dir: Path) -> list[dict]:
    from cory_rl.train.training.run import run_training

    config = tiny_config(
        model_dir,
        run_dir,
        "cory",
        batch_size=8,
        iterations=3,
        max_new_tokens=[2, 6],
        learner={
            "mini_batch_size": 8,
            "gradient_accumulation_steps": 2,
            "forward_batch_size": 3,
            "ppo_epochs": 2,
            "learning_rate": 1e-3,
            "repetition_penalty": 1.1,
            "kl_penalty": "full_in_reward",  # pinned: the figures predate the exact default
        },
    )
    run = run_training(config)
    return read_jsonl(run.path / "metrics.jsonl")


def test_a_seeded_run_logs_the_metrics_it_logged_before_the_speedups(tiny_model_dir, tmp_path):
    expected = json.loads(REFERENCE.read_text())
    rows = metrics_of_a_seeded_run(tiny_model_dir, tmp_path / "run")
    assert len(rows) == len(expected)
    compared = 0
    for row, old in zip(rows, expected, strict=True):
        for key, value in old.items():
            if not isinstance(value, (int, float)) or key.startswith(("time/", "memory/")):
                continue
            assert key in row, key
            assert math.isclose(row[key], value, rel_tol=1e-4, abs_tol=1e-5), (
                f"iteration {row['iteration']}: {key} = {row[key]}, was {value}"
            )
            compared += 1
    assert compared > 100  # the comparison covered the run, not a handful of keys


if __name__ == "__main__":  # python -m tests.test_same_metrics OUT.json (regenerate)
    import sys
    import tempfile

    from tests.conftest import make_tiny_lm, make_tiny_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        tokenizer = make_tiny_tokenizer()
        make_tiny_lm(len(tokenizer)).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        rows = metrics_of_a_seeded_run(str(model_dir), Path(tmp) / "run")
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))
