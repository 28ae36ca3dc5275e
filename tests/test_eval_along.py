"""Held-out evaluations along training (``eval_every``): files, rows, resume, no side effects."""

from __future__ import annotations

import json

import pytest

from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.core.run_folder import EVAL_KEY, read_evaluations, read_metrics
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config

EVAL = {"eval_samples": 2, "eval_queries": 5, "eval_batch_size": 8}
TIMES = ("time/iteration_s", "time/rollout_s", "memory/peak_mb", "time/eval_s")


def without_times(rows):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in rows]


def test_eval_every_writes_the_trajectory_and_trains_the_same(tiny_model_dir, tmp_path):
    plain = run_training(tiny_config(tiny_model_dir, tmp_path / "plain", iterations=3))
    run = run_training(
        tiny_config(tiny_model_dir, tmp_path / "evals", iterations=3, eval_every=2, **EVAL)
    )
    names = sorted(p.name for p in (run.path / "evals").iterdir())
    assert names == [f"updates_{n:06d}.{ext}" for n in (0, 2, 3) for ext in ("json", "md")]
    # Evaluating along the way changes nothing of the training itself.
    assert without_times(read_metrics(run.path)) == without_times(read_metrics(plain.path))
    rows = read_evaluations(run.path)
    assert [r[EVAL_KEY] for r in rows] == [0, 2, 3] and [r["iteration"] for r in rows] == [-1, 1, 2]
    assert rows[0]["eval/all/kl"] == pytest.approx(0, abs=1e-5)  # the base model itself
    assert "eval/all/reward_minus_base" not in rows[0]
    assert rows[-1]["eval/all/kl"] > 0 and "eval/pioneer/reward_minus_base" in rows[-1]
    base = json.loads((run.path / "evals" / "updates_000000.json").read_text())
    last = json.loads((run.path / "evals" / "updates_000003.json").read_text())
    assert base["updates"] == 0 and set(base["answers"]["model"]) == {"reference"}
    assert last["updates"] == 3 and set(last["answers"]["model"]) == {"trained"}
    assert last["eval_set"] == base["eval_set"]  # one set along the whole run
    assert last["summary"]["trained"]["all"]["reward"] == rows[-1]["eval/all/reward"]
    from cory_rl.train.analysis.run_summary import run_summary

    assert "held-out reward" in run_summary(run.path) and "3 iterations" in run_summary(run.path)
    # TensorBoard has the evaluations under their own keys, at step = updates.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/all/reward")] == [0, 2, 3]
    # ... and the end-of-run summary, as the other trackers get it.
    assert [e.value for e in events.Scalars("summary/iterations")] == [3.0]
    assert events.Scalars("summary/held_out_reward")[0].value == pytest.approx(
        rows[-1]["eval/all/reward"], rel=1e-6
    )


def test_a_resumed_run_keeps_its_evaluations_and_pairs_with_its_base(tiny_model_dir, tmp_path):
    straight = run_training(
        tiny_config(tiny_model_dir, tmp_path / "a", iterations=4, eval_every=1, **EVAL)
    )
    first = run_training(
        tiny_config(tiny_model_dir, tmp_path / "b", iterations=2, eval_every=1, **EVAL)
    )
    config, resume = parse_args(["--resume", str(first.path), "--iterations", "4"], "cory")
    resumed = run_training(config, resume)
    a, b = read_evaluations(straight.path), read_evaluations(resumed.path)
    assert [r[EVAL_KEY] for r in b] == [0, 1, 2, 3, 4]
    assert without_times(a) == without_times(b)
    assert len(read_jsonl(resumed.path / "metrics.jsonl")) == 4 + 5  # no duplicates
