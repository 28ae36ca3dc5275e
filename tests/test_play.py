"""Talking to trained agents: each answers a typed query in its role, scored and paid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cory_rl.train.commands import play
from cory_rl.train.training.run import run_training
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cory_run(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("play") / "run"
    run_training(tiny_config(tiny_model_dir, path, iterations=2))
    return path


def test_each_agent_answers_the_query_in_its_role(cory_run, capsys):
    [game] = play.main([str(cory_run), "--query", "The film was", "--max_new_tokens", "3"])
    assert game["query"] == "The film was"
    assert [game[r]["agent"] for r in ("pioneer", "observer")] == ["llm_0", "llm_1"]
    for role in ("pioneer", "observer"):
        assert isinstance(game[role]["response"], str)
    # The collective reward: each agent is paid both scores (lam 1).
    total = game["pioneer"]["score"] + game["observer"]["score"]
    assert game["pioneer"]["reward"] == pytest.approx(total)
    out = capsys.readouterr().out
    assert "query: 'The film was'" in out and "pioneer (llm_0)" in out and "reward" in out
    [swapped] = play.main([str(cory_run), "--query", "A long day", "--pioneer", "llm_1"])
    assert swapped["pioneer"]["agent"] == "llm_1" and swapped["observer"]["agent"] == "llm_0"


def test_models_take_the_seats_without_a_run(tiny_model_dir):
    [game] = play.main(["--model", tiny_model_dir, "--query", "Hello there"])
    assert game["pioneer"]["agent"] == "llm_0" and "observer" not in game


def test_bad_input_is_one_line(cory_run, capsys):
    cases = {
        "": "give a run folder or --model folders",
        f"{cory_run} --model embedded": "give a run folder or --model folders",
        f"{cory_run} --pioneer llm_7": "--pioneer llm_7: the seats are ['llm_0', 'llm_1']",
        f"{cory_run.parent}": "is not a run folder",
    }
    for argv, message in cases.items():
        with pytest.raises(SystemExit):
            play.main(argv.split())
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[0] and len(err) <= 2, err  # the error and where help is
    for argv, message in (
        (["--query", "   "], "--query: empty"),
        (["--query", ""], "empty"),
        (["--query", "a", "--max_new_tokens", "0"], "at least 1"),
    ):
        with pytest.raises(SystemExit):
            play.main([str(cory_run), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[0] and len(err) <= 2, err


def test_play_runs_interactively_as_a_command(cory_run):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "train" / "play.py"), str(cory_run), "--max_new_tokens", "2"],
        input="The plot\n\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "query: 'The plot'" in done.stdout and "observer (llm_1)" in done.stdout
