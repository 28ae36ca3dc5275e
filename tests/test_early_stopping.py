"""Early stopping on the held-out evaluations: the rule by hand, and a run that stops by it,
leaves its marker, counts as done for a resume and a sweep, and is refused without
evaluations."""

from __future__ import annotations

import json

import pytest

from cory_env.checks import SettingError
from cory_rl.train.core.stopping import EarlyStopping, stopped
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config


def evaluation(updates, reward):
    return {"iteration": updates - 1, "eval/updates": updates, "eval/pioneer/reward": reward}


def test_a_target_stops_once_reached_but_not_before_the_minimum():
    rule = EarlyStopping(target=0.5, min_updates=20)
    assert rule.add(evaluation(10, 0.6)) is None  # reached, but before 20 updates
    assert "reached 0.550 after 20 updates" in rule.add(evaluation(20, 0.55))


def test_patience_counts_evaluations_that_do_not_beat_the_best_by_the_threshold():
    rule = EarlyStopping(patience=2, threshold=0.02)
    assert rule.add(evaluation(0, 0.10)) is None
    assert rule.add(evaluation(10, 0.20)) is None  # best 0.20
    assert rule.add(evaluation(20, 0.21)) is None  # +0.01: no rise, one in a row
    assert rule.add(evaluation(30, 0.25)) is None  # +0.05 over 0.20: a rise
    assert rule.add(evaluation(40, 0.26)) is None  # best before the last two: 0.21
    reason = rule.add(evaluation(50, 0.24))  # best before the last two: 0.25; then 0.26
    assert reason is not None and "did not rise above 0.250 by more than 0.02" in reason
    assert EarlyStopping(patience=2).add({"eval/updates": 10}) is None  # metric absent


def test_a_run_stops_by_its_rule_and_is_done_for_resume(tiny_model_dir, tmp_path, capsys):
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        "ppo",
        iterations=8,
        eval_every=2,
        eval_queries=2,
        eval_samples=1,
        checkpoint_every=3,
        early_stopping_target=-1e9,
        early_stopping_min_updates=4,
    )
    run_training(config)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert max(r["iteration"] for r in rows) == 3  # the evaluation after update 4 stopped it
    marker = stopped(tmp_path / "run")
    assert marker["updates"] == 4 and "early_stopping_target" in marker["reason"]
    saved = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert saved["iteration"] == 3  # a checkpoint at the stop, between the regular ones
    capsys.readouterr()
    assert run_training(config, resume_dir=tmp_path / "run") is None
    assert "stopped by its early-stopping rule after 4 updates" in capsys.readouterr().out


def test_a_rule_without_evaluations_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(SettingError, match="eval_every is 0"):
        tiny_config(tiny_model_dir, tmp_path / "run", early_stopping_patience=3)
