"""Evaluation on held-out queries: every agent in every role, the base model as a baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import tiny_config
from train import evaluate as ev
from train.run import run_training


@pytest.fixture(scope="module")
def cory_run(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "cory"
    run_training(tiny_config(tiny_model_dir, path, "cory", iterations=2))
    return path


def test_every_agent_plays_every_role_beside_the_reference(cory_run, capsys):
    (result,) = ev.main([str(cory_run), "--batch_size", "4", "--batches", "2", "--show", "1"])
    saved = json.loads((cory_run / "eval.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    cells = {(r["model"], r["agent"], r["role"]): r for r in result["rows"]}
    seats = [(a, r) for a in ("llm_0", "llm_1") for r in ("pioneer", "observer")]
    assert set(cells) == {(m, a, r) for m in ("reference", "trained") for a, r in seats}
    for row in cells.values():
        assert row["reward"]["n"] == 8  # 2 batches of 4
        lo, hi = row["reward"]["ci95"]
        assert lo <= row["reward"]["mean"] <= hi
        assert row["pass@k"] is None  # imdb is not answer-checked
        assert set(row["objective"]) == {"1e-05", "0.0001", "0.001", "0.01"}
        eta = 0.01
        expected = row["reward"]["mean"] - eta * row["kl"]["mean"]
        assert row["objective"]["0.01"] == pytest.approx(expected)
        assert 0 <= row["repetitive"] <= 1 and 0 <= row["hit_budget"] <= 1
        assert row["entropy"] > 0 and 1 <= row["length"] <= 4
    # The base model is its own reference: KL 0. The trained agents moved away from it.
    assert all(abs(cells["reference", a, r]["kl"]["mean"]) < 1e-5 for a, r in seats)
    assert all(cells["trained", a, r]["kl"]["mean"] > 0 for a, r in seats)
    assert result["held_out"]["held_out"] and result["held_out"]["task_settings"]["split"] == "test"
    # Each rotation plays the same queries: the pioneer seat moved, the queries did not.
    trained = result["samples"]["trained"]
    assert [s["pioneer"]["agent"] for s in trained] == ["llm_0", "llm_1"]
    assert trained[0]["query"] == trained[1]["query"]
    assert result["summary"]["trained"]["all"]["n"] == 32
    md = (cory_run / "eval.md").read_text()
    assert "| model | agent | role | n | reward | 95% CI | KL | r - 1e-05 KL" in md
    assert "| trained | llm_1 | observer |" in md and "distinct-2" in md
    assert md.splitlines()[2] in capsys.readouterr().out


def test_arith_reports_pass_at_k_on_problems_training_never_draws(tiny_model_dir, tmp_path):
    from cory_env.tasks import make_task

    config = tiny_config(tiny_model_dir, tmp_path / "unused", "ppo", task="arith")
    result = ev.evaluate(config, None, batches=1, batch_size=8, k=4)
    (row,) = result["rows"]
    assert (row["model"], row["agent"], row["role"]) == ("reference", "llm_0", "pioneer")
    assert set(row["pass@k"]) == {"1", "2", "4"} and result["group_size"] == 4
    assert result["held_out"]["task_settings"]["seed"] == 1
    # The evaluation game itself: no training problem left in it.
    from train.run import build_game_and_learners

    game, _ = build_game_and_learners(
        ev.eval_config(config, 8, 4, result["held_out"]["task_settings"], None)
    )
    assert ev.drop_training_queries(game, config) > 0  # seeds 0 and 1 share a few problems
    training = {q.text for q in make_task("arith").queries}
    assert game.task.queries and not training & {q.text for q in game.task.queries}


def test_base_model_alone_from_the_command_line(tiny_model_dir, tmp_path):
    out = tmp_path / "base"
    flags = ["--task", "imdb", "--model", tiny_model_dir, "--algorithm", "ppo", "--out", str(out)]
    (result,) = ev.main([*flags, "--batch_size", "4", "--batches", "1", "--device", "cpu"])
    assert [r["model"] for r in result["rows"]] == ["reference"]
    assert (out / "eval.json").is_file() and (out / "eval.md").is_file()


def test_pass_at_k_of_a_cell_comes_from_its_query_groups():
    answers = ev.Answers(
        scores=[1.0, 0, 0, 0, 1, 1, 1, 1],
        kls=[0.0] * 8,
        lengths=[3] * 8,
        hit_budget=[False] * 8,
        texts=["the answer is 4"] * 8,
        correct=list(np.array([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)),
    )
    row = ev.cell_metrics(answers, (0.01,), checked=True)
    # query 1: 1 of 4 correct -> pass@1 1/4, pass@2 1 - C(3,2)/C(4,2) = 1/2; query 2: all.
    assert row["pass@k"] == {"1": 0.625, "2": 0.75, "4": 1.0}
    assert row["entropy"] is None and row["reward"]["mean"] == 0.625


@pytest.mark.parametrize(
    ("task", "settings", "held_out", "changed"),
    [
        ("imdb", {}, True, {"split": "test"}),
        ("imdb", {"dataset": "stanfordnlp/imdb"}, True, {"split": "test"}),
        ("imdb", {"dataset": "reviews.jsonl"}, False, {}),
        ("imdb", {"split": "all"}, False, {}),
        ("gsm8k", {"dataset": "openai/gsm8k", "split": "train"}, True, {"split": "test"}),
        ("gsm8k", {}, False, {}),
        ("arith", {"seed": 7, "n_steps": 2}, True, {"seed": 8}),
        ("custom", {}, False, {}),
    ],
)
def test_held_out_settings(task, settings, held_out, changed):
    out, note, is_held_out = ev.held_out_settings(task, settings)
    assert is_held_out == held_out and note
    assert out == {**settings, **changed}
