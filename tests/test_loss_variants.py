"""TRL 1.x's GRPO loss variants (loss_type, epsilon_high, GSPO's sequence ratio, truncated
answers left out): checked against TRL's own ``_compute_loss`` on identical tensors, against
hand-computed values, and through the learner's chunked mini-batch update."""

from __future__ import annotations

import collections
import dataclasses
import math
import types

import pytest
import torch

from cory_env.checks import SettingError
from cory_rl.agents import pg_math as pg
from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
from cory_rl.agents.policy import build_policies
from tests.test_baselines import FIXED, rollout_of, token_logprobs

D = torch.float64


# ---------------------------------------------------------------- TRL on identical tensors


def trl_loss(inputs: dict, logps: torch.Tensor, **settings) -> torch.Tensor:
    """TRL's ``GRPOTrainer._compute_loss`` with the model's log-probs given: the trainer is
    built without a model, holding only what that method reads."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    def metrics() -> collections.defaultdict:
        return collections.defaultdict(list)

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    B, T = logps.shape
    accelerator = types.SimpleNamespace(
        num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x
    )
    trainer.__dict__.update(
        model=types.SimpleNamespace(training=True),
        accelerator=accelerator,
        args=types.SimpleNamespace(
            use_bias_correction_kl=False, delta=None, steps_per_generation=1
        ),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        _metrics=collections.defaultdict(metrics),
        **settings,
    )
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
        logps,
        torch.zeros_like(logps),
        None,
    )
    full = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "num_items_in_batch": inputs["completion_mask"].sum(),
        **inputs,
    }
    return trainer._compute_loss(None, full)


def batch(seed: int = 0, B: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logps = (old + 0.3 * torch.randn(B, T, generator=g, dtype=D)).requires_grad_()
    ref = old - 0.2 * torch.rand(B, T, generator=g, dtype=D)
    adv = torch.randn(B, generator=g, dtype=D)
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", pg.LOSS_TYPES)
@pytest.mark.parametrize("level", pg.IMPORTANCE_SAMPLING_LEVELS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_variants_are_trls_loss_and_gradient(loss_type, level, beta):
    logps, old, ref, adv, mask = batch()
    eps_low, eps_high = 0.2, 0.28
    inputs = {
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
    }
    theirs = trl_loss(
        inputs,
        logps,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
    )
    (their_grad,) = torch.autograd.grad(theirs, logps)

    log_w = pg.importance_log_weights(logps, old, mask, level)
    per_token, _, _ = pg.clipped_surrogate(log_w, adv[:, None], eps_low, eps_high)
    k3 = torch.exp(ref - logps) - (ref - logps) - 1
    per_token = per_token + beta * k3
    mean_length = float(mask.sum()) / len(mask)
    ours = pg.aggregate_loss(per_token, mask, loss_type, max_length=5, mean_length=mean_length)
    (our_grad,) = torch.autograd.grad(ours, logps)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- by hand


def test_the_reductions_by_hand():
    # two answers: 3 tokens of loss 1, 2, 3 and 1 token of loss 4 (padding ignored)
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    agg = pg.aggregate_loss
    assert float(agg(loss, mask, "grpo")) == pytest.approx((2.0 + 4.0) / 2)
    assert float(agg(loss, mask, "bnpo")) == pytest.approx(10.0 / 4)
    assert float(agg(loss, mask, "dr_grpo", max_length=8)) == pytest.approx(10.0 / (2 * 8))
    # dapo: this batch of 2 is half a generation batch whose answers average 5 tokens
    assert float(agg(loss, mask, "dapo", mean_length=5.0)) == pytest.approx(10.0 / (2 * 5))
    with pytest.raises(ValueError, match="max_length"):
        agg(loss, mask, "dr_grpo")
    with pytest.raises(ValueError, match="loss_type"):
        agg(loss, mask, "token_mean")


def test_clip_higher_and_the_sequence_ratio_by_hand():
    adv = torch.tensor([[1.0], [-1.0]], dtype=D)
    log_w = torch.log(torch.tensor([[1.25], [0.7]], dtype=D))
    loss, low, high = pg.clipped_surrogate(log_w, adv, 0.2, 0.28)
    # w = 1.25 < 1.28 is not clipped above; w = 0.7 < 0.8 with A < 0 is clipped below
    torch.testing.assert_close(loss, torch.tensor([[-1.25], [0.8]], dtype=D))
    assert high.tolist() == [[False], [False]] and low.tolist() == [[False], [True]]
    _, _, high = pg.clipped_surrogate(log_w, adv, 0.2, 0.2)
    assert high.tolist() == [[True], [False]]
    # GSPO: the mean log-ratio over the valid tokens, one per answer
    logps = torch.tensor([[0.0, -1.0, 5.0]], dtype=D)
    old = torch.tensor([[-0.3, -0.9, 0.0]], dtype=D)
    seq = pg.importance_log_weights(logps, old, torch.tensor([[1, 1, 0]]), "sequence")
    torch.testing.assert_close(seq, torch.tensor([[(0.3 - 0.1) / 2]], dtype=D))


def test_truncated_rows_are_those_without_eos():
    eos = 9
    tokens = torch.tensor([[3, 9, 9], [3, 4, 5], [9, 0, 0], [1, 2, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    assert pg.truncated_rows(tokens, mask, eos).tolist() == [False, True, False, True]


def test_the_settings_are_checked():
    for bad, match in [
        ({"loss_type": "token_mean"}, "loss_type"),
        ({"importance_sampling_level": "answer"}, "importance_sampling_level"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
        ({"mask_truncated_completions": "yes"}, "mask_truncated"),
    ]:
        with pytest.raises(SettingError, match=match):
            GRPOConfig(**bad).validate()
    assert GRPOConfig(clip_range=0.2).clip_high == 0.2
    assert GRPOConfig(clip_range=0.2, epsilon_high=0.28).clip_high == 0.28


# ---------------------------------------------------------------- through the learner


def grpo(tiny_tokenizer, tiny_lm, **settings):
    cfg = GRPOConfig(**{"mini_batch_size": 4, "ppo_epochs": 1, **FIXED, **settings})
    [policy], reference = build_policies(tiny_lm, 1)
    eos = tiny_tokenizer.eos_token_id
    agent = GRPOAgent(
        policy,
        reference,
        cfg,
        tiny_tokenizer.pad_token_id,
        group_size=2,
        eos_token_id=eos,
        max_new_tokens=3,
    )
    agent.optimisation.steps_in_backward = lambda settings: False  # every gradient kept
    return agent


def shared_rollout(agent, tokenizer):
    ro = rollout_of(agent, tokenizer, batch=4, budget=3, group_size=2)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    tokens = ro.tokens.clone()
    tokens[1, 0] = tokens[2, 1] = tokenizer.eos_token_id  # rows 1 and 2 end with EOS
    tokens[0, 2] = tokens[3, 2] = (tokenizer.eos_token_id + 1) % len(tokenizer)  # 0, 3 cut
    ro = dataclasses.replace(
        ro, tokens=tokens, mask=mask, rewards=torch.tensor([1.0, 0.0, 0.5, 0.2])
    )
    logprobs = token_logprobs(agent, ro)  # of the tokens put in: the update starts on-policy
    return dataclasses.replace(ro, logprobs=logprobs, sample_logprobs=logprobs)


def gradients(agent, ro):
    grads = []
    params = agent.model.trainable_parameters()
    agent.optimizer.step = lambda: grads.append(
        [p.grad.clone() for p in params if p.grad is not None]
    )
    agent.rollout = ro
    stats = agent.learn()
    return grads[0], stats


@pytest.mark.parametrize(
    "settings",
    [{"loss_type": t} for t in ("grpo", "dr_grpo", "dapo")]
    + [
        {"importance_sampling_level": "sequence", "loss_type": "grpo", "epsilon_high": 0.28},
        {"mask_truncated_completions": True},
    ],
)
def test_every_split_of_a_mini_batch_gives_its_gradient(tiny_tokenizer, tiny_lm, settings):
    """Micro-batches and forward chunks add up to the mini-batch's gradient for every
    reduction that is a mean over answers (bnpo, TRL's, is per micro-batch: see below)."""
    ro, reference = None, None
    for steps, rows in ((1, 16), (2, 16), (1, 1), (4, 1)):
        agent = grpo(
            tiny_tokenizer,
            tiny_lm,
            gradient_accumulation_steps=steps,
            forward_batch_size=rows,
            **settings,
        )
        ro = ro or shared_rollout(agent, tiny_tokenizer)
        grads, _ = gradients(agent, ro)
        if reference is None:
            reference = grads
        for a, b in zip(reference, grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_bnpo_is_a_token_mean_per_micro_batch(tiny_tokenizer, tiny_lm):
    """Forward chunks still add up; micro-batches count alike, as TRL's bnpo divides each
    accumulation step's loss by its own tokens."""
    ro, reference = None, None
    for rows in (16, 1):
        agent = grpo(tiny_tokenizer, tiny_lm, loss_type="bnpo", forward_batch_size=rows)
        ro = ro or shared_rollout(agent, tiny_tokenizer)
        grads, _ = gradients(agent, ro)
        reference = reference or grads
        for a, b in zip(reference, grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_loss_types_differ_where_answers_differ_in_length(tiny_tokenizer, tiny_lm):
    ro, losses = None, {}
    for loss_type in pg.LOSS_TYPES:
        agent = grpo(tiny_tokenizer, tiny_lm, loss_type=loss_type, init_kl_coef=0.5)
        ro = ro or shared_rollout(agent, tiny_tokenizer)
        agent.rollout = ro
        losses[loss_type] = agent.learn()["grpo/loss"]
    # on-policy the surrogate is -A per token; the k3 term is 0 at the first step (policy =
    # reference), so each loss is -sum_i A_i n_i / (its normaliser)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    b = 0.15 / (math.sqrt(0.045) + 1e-4)
    adv, n = [a, -a, b, -b], [3, 1, 2, 3]
    total = -sum(x * k for x, k in zip(adv, n, strict=True))
    assert losses["grpo"] == pytest.approx(-sum(adv) / 4, abs=1e-5)
    assert losses["bnpo"] == pytest.approx(total / 9, abs=1e-5)
    assert losses["dr_grpo"] == pytest.approx(total / (4 * 3), abs=1e-5)
    assert losses["dapo"] == pytest.approx(total / (4 * 9 / 4), abs=1e-5)


def test_truncated_answers_leave_the_loss(tiny_tokenizer, tiny_lm):
    agent = grpo(tiny_tokenizer, tiny_lm, mask_truncated_completions=True, loss_type="bnpo")
    ro = shared_rollout(agent, tiny_tokenizer)
    agent.rollout = ro
    stats = agent.learn()
    assert stats["grpo/frac_truncated"] == 0.5
    # rows 1 and 2 remain (advantages -a and b, 1 and 2 tokens): bnpo over their 3 tokens
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    b = 0.15 / (math.sqrt(0.045) + 1e-4)
    assert stats["grpo/loss_policy"] == pytest.approx(-(-a * 1 + b * 2) / 3, abs=1e-5)
    cfg = RLOOConfig(mask_truncated_completions=True, **FIXED)
    [policy], reference = build_policies(tiny_lm, 1)
    with pytest.raises(SettingError, match="EOS"):
        RLOOAgent(policy, reference, cfg, tiny_tokenizer.pad_token_id, group_size=2)
    with pytest.raises(SettingError, match="dr_grpo"):
        GRPOAgent(policy, reference, GRPOConfig(loss_type="dr_grpo"), 0, group_size=2)


def test_the_variants_are_flags_of_a_run(tiny_model_dir, tmp_path):
    from cory_rl.train.commands.train_flags import parse_args
    from cory_rl.train.training.run import run_training
    from tests.conftest import read_jsonl, tiny_flags

    flags = tiny_flags(
        tiny_model_dir,
        tmp_path / "r",
        iterations=1,
        group_size=2,
        loss_type="dr_grpo",
        importance_sampling_level="sequence",
        epsilon_high=0.28,
        mask_truncated_completions="true",
    )
    config, _ = parse_args(flags, "grpo")
    seat = config.seat_learners()["llm_0"][1]
    assert (seat.loss_type, seat.importance_sampling_level, seat.epsilon_high) == (
        "dr_grpo",
        "sequence",
        0.28,
    )
    [row] = read_jsonl(run_training(config).path / "metrics.jsonl")
    assert math.isfinite(row["llm_0/grpo/loss"]) and 0 <= row["llm_0/grpo/frac_truncated"] <= 1
