"""The paper-gsm8k preset: the paper's GSM8K setup, checked as a config and run on a tiny model."""

from __future__ import annotations

import pytest
import torch
import yaml

from cory_env import load_causal_lm
from cory_env.checks import SettingError
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config.resolve import build_config
from tests.conftest import read_jsonl


@pytest.mark.parametrize(("algorithm", "lr"), [("cory", 1e-4), ("ppo", 1e-5), ("reinforce", 1e-5)])
def test_paper_gsm8k_is_the_papers_setup(algorithm, lr):
    config = build_config("paper-gsm8k", algorithm=algorithm)
    assert config.model == "meta-llama/Llama-2-7b-chat-hf" and config.task == "gsm8k"
    assert config.task_settings == {"dataset": "openai/gsm8k", "split": "train"}
    assert config.load_in_4bit and config.lora and config.learner["learning_rate"] == lr
    # batch 32; official mini-batch 2 x 16 accumulation = one optimiser step per 32 answers
    assert config.batch_size == 32 and config.learner["mini_batch_size"] == 32
    assert config.learner["mini_batch_size"] // config.learner["gradient_accumulation_steps"] == 2
    # A flag still wins over the preset's per-algorithm learning rate.
    flagged, _ = parse_args(["--preset", "paper-gsm8k", "--learning_rate", "3e-5"], algorithm)
    assert flagged.learner["learning_rate"] == 3e-5


def test_4bit_needs_lora_a_gpu_and_bitsandbytes(tiny_model_dir):
    with pytest.raises(SettingError, match="load_in_4bit .* needs lora true"):
        build_config(overrides={"load_in_4bit": True})
    with pytest.raises(SettingError, match="device='cpu'"):
        build_config(overrides={"load_in_4bit": True, "lora": True, "device": "cpu"})
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            load_causal_lm(tiny_model_dir, load_in_4bit=True)


def test_paper_gsm8k_trains_and_evaluates_on_a_tiny_model(tiny_model_dir, tmp_path):
    from cory_rl.train.evaluation.evaluator import evaluate
    from cory_rl.train.training.run import run_training

    overrides = {
        "model": tiny_model_dir,
        "load_in_4bit": False,
        "device": "cpu",
        "iterations": 1,
        "task_settings": {"split": "train"},  # the packaged fixture: no hub here
        "max_new_tokens": 3,
        "context_length": 48,
        "run_dir": str(tmp_path / "run"),
        "learner": {"ppo_epochs": 1},  # short: still 16 micro-batches of 2 per optimiser step
    }
    config = build_config("paper-gsm8k", overrides=overrides, algorithm="cory")
    with pytest.warns(UserWarning, match="does not fit context_length"):
        run_training(config)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["learner"]["learning_rate"] == 1e-4
    assert saved["learner"]["gradient_accumulation_steps"] == 16
    (row,) = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert row["llm_0/ppo/loss_total"] == row["llm_0/ppo/loss_total"]  # trained, not NaN
    with pytest.warns(UserWarning, match="not held out"):  # the fixture has one split
        result = evaluate(
            config, tmp_path / "run", batch_size=8, samples=1, max_queries=8, reference=False
        )
    assert {r["role"] for r in result["rows"]} == {"pioneer", "observer"}
    assert all(set(r["pass@k"]) == {"1"} for r in result["rows"])
