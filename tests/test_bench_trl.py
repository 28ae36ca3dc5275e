"""bench/bench_trl.py's pure helpers: both sides get the same work per step, and a difference
in what they did is reported. No model is loaded and nothing is trained."""

from __future__ import annotations

import numpy as np
import pytest

from bench import bench_trl
from cory_rl.train.config.resolve import build_config

SPLITS = [
    # prompts, group_size, mini_batch_size, gradient_accumulation_steps, epochs
    (8, 4, None, 1, 1),  # the default: one optimiser step per generation
    (8, 4, 16, 2, 2),  # two mini-batches of two micro-batches, two passes
    (2, 4, 4, 4, 3),
    (3, 2, 6, 3, 1),
]


def argv(prompts, group, mini, accumulation, epochs, *extra):
    out = [
        "--prompts",
        str(prompts),
        "--group_size",
        str(group),
        "--epochs",
        str(epochs),
        "--gradient_accumulation_steps",
        str(accumulation),
        "--steps",
        "3",
        *extra,
    ]
    return out + (["--mini_batch_size", str(mini)] if mini else [])


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("learner", ["grpo", "rloo"])
def test_trl_config_does_our_steps_work(split, learner):
    args = bench_trl.parse_args(argv(*split))
    plan = bench_trl.make_plan(args)
    ours = bench_trl.our_overrides(args, learner)
    trl = bench_trl.trl_kwargs(args, learner, "unused")
    prompts, group, _, _, epochs = split
    # Completions per step: our batch, TRL's generation batch (GRPOConfig's own rule).
    assert ours["batch_size"] == prompts * group == plan.answers
    assert bench_trl.trl_completions_per_cycle(trl) == prompts * group
    assert trl["num_generations"] == ours["group_size"] == group
    # Optimiser steps per step, and in all.
    steps = epochs * plan.answers // plan.mini_batch_size
    assert bench_trl.trl_optimizer_steps_per_cycle(trl) == steps == plan.optimizer_steps
    assert trl["max_steps"] == 3 * steps and ours["iterations"] == 3
    # The same micro-batch, passes, KL and tokens on both sides.
    learner_settings = ours["learner"]
    assert trl["per_device_train_batch_size"] == learner_settings["forward_batch_size"]
    micro, accumulation = trl["per_device_train_batch_size"], trl["gradient_accumulation_steps"]
    assert micro * accumulation == learner_settings["mini_batch_size"]
    assert trl["num_iterations"] == learner_settings["ppo_epochs"] == epochs
    assert trl["beta"] == learner_settings["init_kl_coef"] == bench_trl.TRL_BETA[learner]
    assert learner_settings["adaptive_kl"] is False
    assert trl["max_completion_length"] == ours["max_new_tokens"]
    assert trl["generation_kwargs"] == {"min_new_tokens": ours["max_new_tokens"]}
    assert trl["epsilon"] == learner_settings["clip_range"]
    assert trl["shuffle_dataset"] is False and trl["bf16"] is False


def test_flags_reach_both_sides():
    args = bench_trl.parse_args(
        [
            "--beta",
            "0.1",
            "--new_tokens",
            "64",
            "--learning_rate",
            "3e-6",
            "--max_grad_norm",
            "0",
            "--activation_checkpointing",
        ]
    )
    for learner in ("grpo", "rloo"):
        ours, trl = bench_trl.our_overrides(args, learner), bench_trl.trl_kwargs(args, learner, "x")
        assert trl["beta"] == ours["learner"]["init_kl_coef"] == 0.1
        assert trl["max_completion_length"] == ours["max_new_tokens"] == 64
        assert trl["learning_rate"] == ours["learner"]["learning_rate"] == 3e-6
        assert trl["max_grad_norm"] == 0 and ours["learner"]["max_grad_norm"] is None
        assert trl["activation_checkpointing"] is ours["activation_checkpointing"] is True
    assert bench_trl.trl_kwargs(args, "grpo", "x")["use_bias_correction_kl"] is False
    assert bench_trl.our_overrides(args, "rloo")["learner"]["kl_penalty"] == "k1"
    assert bench_trl.our_overrides(args, "grpo")["learner"]["kl_penalty"] == "k3_in_loss"


@pytest.mark.parametrize("learner", ["grpo", "rloo"])
def test_our_overrides_make_a_valid_config(learner):
    args = bench_trl.parse_args(argv(8, 4, 16, 2, 2))
    config = build_config(overrides=bench_trl.our_overrides(args, learner), algorithm=learner)
    settings = config.learner
    assert config.batch_size == 32 and config.game.group_size == 4
    assert config.game.max_new_tokens == 15 and config.report_to == ["none"]
    assert (settings["mini_batch_size"], settings["gradient_accumulation_steps"]) == (16, 2)
    assert settings["forward_batch_size"] == 8 and settings["ppo_epochs"] == 2
    # The algorithms' defaults that TRL does not share are overridden.
    assert settings["repetition_penalty"] == 1.0 and settings["max_grad_norm"] == 1.0
    assert not (settings["score_scaling"] or settings["score_norm"])
    assert not settings["whiten_advantages"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompts", "3", "--group_size", "4", "--mini_batch_size", "8"], "multiple of"),
        (["--mini_batch_size", "8", "--gradient_accumulation_steps", "3"], "multiple of"),
        (["--group_size", "1"], "group_size"),
    ],
)
def test_splits_one_side_cannot_take_are_refused(capsys, flags, message):
    with pytest.raises(SystemExit):
        bench_trl.parse_args(flags)
    assert message in capsys.readouterr().err


def test_cycles_and_means():
    assert bench_trl.in_cycles([1.0, 2.0, 3.0, 4.0], 2) == [3.0, 7.0]
    assert bench_trl.in_cycles([1.0, 2.0], 1) == [1.0, 2.0]
    with pytest.raises(ValueError):
        bench_trl.in_cycles([1.0, 2.0, 3.0], 2)
    assert bench_trl.steady_mean([100.0, 2.0, 4.0]) == 3.0  # the warm-up is left out
    assert bench_trl.steady_mean([5.0]) == 5.0


def side(generated, trained, prompts, seconds=(9.0, 2.0, 4.0), peak=2048.0):
    return {
        "generated": generated,
        "trained": trained,
        "prompts": prompts,
        "seconds": list(seconds),
        "rewards": [0.1, 0.2, 0.4],
        "process_peak_mb": peak,
        "peak_mb_after_step": [peak],
    }


def test_token_counts_that_differ_are_flagged():
    prompts = [["a", "b"], ["c", "d"]]
    same = side([60, 60], [60, 60], prompts)
    assert bench_trl.mismatches("grpo", same, side([60, 60], [60, 60], prompts)) == []
    lines = bench_trl.mismatches("grpo", same, side([60, 59], [60, 60], prompts))
    assert len(lines) == 1 and lines[0].startswith("MISMATCH grpo") and "generated" in lines[0]
    lines = bench_trl.mismatches("rloo", same, side([60, 60], [60, 120], [["a", "b"], ["c", "x"]]))
    assert len(lines) == 2 and "trained" in lines[0] and "prompts" in lines[1]


def test_report_prints_ratios_and_mismatches():
    args = bench_trl.parse_args(["--learners", "grpo", "--steps", "3"])
    prompts = [["a"], ["b"], ["c"]]
    results = {
        "grpo": {
            "ours": side([8, 8, 8], [8, 8, 8], prompts, peak=1024.0),
            "trl": side([8, 8, 8], [8, 8, 7], prompts, seconds=(1, 6, 6)),
        }
    }
    lines = bench_trl.report(results, args)
    text = "\n".join(lines)
    assert "ours grpo" in text and "TRL GRPOTrainer" in text
    ratio = next(line for line in lines if "ours/TRL" in line)
    assert "0.50x" in ratio  # 3 s against 6 s per step; 1 GB against 2 GB
    assert results["grpo"]["summary"]["memory_ratio"] == 0.5
    assert any(line.startswith("MISMATCH grpo: tokens trained on") for line in lines)


def test_probe_counts_sampled_and_trained_tokens():
    tokens = bench_trl.OurTokens()
    with tokens.phase("end_rollout", None, obs={"num_generated": np.array([3, 4, 4])}):
        pass
    # Two rows: a left-padded prompt of 2, then 3 response positions (keep = T + 1 = 4).
    attention = np.array([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    with tokens.phase("forward", None, inputs=(None, attention, None), keep=4):
        pass
    with tokens.phase("reference_forward", None, inputs=(None, attention, None), keep=4):
        pass
    assert (tokens.generated, tokens.trained) == (11, 5)
