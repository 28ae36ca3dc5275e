"""A run folder's ``environment.jsonl``: where each start of a run ran, kept with its results."""

from __future__ import annotations

import importlib.metadata
import json
from types import SimpleNamespace

import torch

from cory_env.rewards import VaderSentimentReward
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.core import environment
from cory_rl.train.core.results import save_results
from cory_rl.train.training.run import run_training
from tests.conftest import tiny_config


def test_a_line_names_the_machine_the_packages_and_the_code() -> None:
    line = environment.describe(7)
    assert line["iteration"] == 7
    assert line["processor"] and line["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert line["torch_threads"] == torch.get_num_threads()
    assert isinstance(line["cpu_bf16"], bool) and isinstance(line["cuda"], list)
    assert line["versions"]["torch"] == importlib.metadata.version("torch")
    assert "transformers" in line["versions"]
    assert "reward" not in line  # no game, no reward build
    json.dumps(line)  # one JSON line


def test_code_commit_outside_a_checkout_is_none(tmp_path) -> None:
    assert environment.code_commit(tmp_path) is None


def test_the_reward_build_is_named_when_the_reward_has_one() -> None:
    record = {"held_out_accuracy": 0.9, "weights_sha256": "ab"}
    reward = SimpleNamespace(provenance=lambda: record)
    built = SimpleNamespace(task=SimpleNamespace(reward_fn=reward))
    plain = SimpleNamespace(task=SimpleNamespace(reward_fn=lambda queries, responses: []))
    assert environment.describe(0, built)["reward"] == record
    assert "reward" not in environment.describe(0, plain)


def test_each_start_of_a_run_adds_a_line_and_results_keep_them(
    tiny_model_dir, tmp_path, monkeypatch
) -> None:
    # The smoke preset's reward (VADER) has no build; give it one, as the IMDB classifier has.
    record = {"weights_sha256": "ab"}
    monkeypatch.setattr(VaderSentimentReward, "provenance", lambda self: record, raising=False)
    first = run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=2))
    lines = environment.read_environment(first.path)
    assert [line["iteration"] for line in lines] == [0]
    assert lines[0]["reward"] == record  # the run's own game's reward, reached by the loop
    config, resume = parse_args(["--resume", str(first.path), "--iterations", "3"], "cory")
    resumed = run_training(config, resume)
    lines = environment.read_environment(resumed.path)
    assert [line["iteration"] for line in lines] == [0, 2]  # the resumed stretch, from 2
    saved = save_results(resumed.path, tmp_path / "results" / "run")
    assert environment.read_environment(saved) == lines
    done = json.loads((saved / "done.json").read_text())
    assert environment.ENVIRONMENT_FILE in done["files"]


def test_an_older_run_folder_has_no_lines(tmp_path) -> None:
    assert environment.read_environment(tmp_path) == []
