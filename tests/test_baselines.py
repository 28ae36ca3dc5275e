"""The rebuttal's baselines as learners: REINFORCE, Elastic Reset, RLOO and GRPO.

Their math is checked against numbers derived by hand in the comments (as in
tests/test_ppo_math.py); each learner's update on a tiny model against hand-computed
advantages and losses; and each trains and resumes through the real run path.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch

import cory_env
from cory_env.checks import SettingError
from cory_rl.agents import pg_math as pg
from cory_rl.agents.elastic_reset import (
    ElasticReset,
    elastic_reset_,
    ema_update_,
    reset_parameters,
)
from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
from cory_rl.agents.policy import build_policies
from cory_rl.agents.ppo import PPOAgent, PPOConfig
from cory_rl.agents.reinforce import ReinforceAgent, ReinforceConfig
from cory_rl.agents.rollout import response_logits
from cory_rl.agents.state_io import CheckpointError
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config.resolve import build_config
from cory_rl.train.training.loop import play_batch
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config, tiny_flags

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual.to(D), t(expected), atol=atol, rtol=0)


# ---------------------------------------------------------------- REINFORCE math


def test_returns_to_go_by_hand():
    rewards = t([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])  # 99 is padding
    mask = t([[1, 1, 1], [1, 1, 0]])
    # gamma 1: row 0: 1+2+3, 2+3, 3 = 6, 5, 3; row 1: 4+5, 5, (pad) 0
    close(pg.returns_to_go(rewards, mask, 1.0), [[6.0, 5.0, 3.0], [9.0, 5.0, 0.0]])
    # gamma 0.5: row 0: G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75
    #            row 1: G1 = 5, G0 = 4 + 0.5*5 = 6.5
    close(pg.returns_to_go(rewards, mask, 0.5), [[2.75, 3.5, 3.0], [6.5, 5.0, 0.0]])


def test_running_mean_baseline_by_hand():
    running = pg.RunningMean(decay=0.9)
    assert running.value is None
    running.update(1.0)  # the first batch simply starts it
    assert running.value == 1.0
    running.update(3.0)  # 0.9 * 1 + 0.1 * 3 = 1.2
    assert running.value == pytest.approx(1.2)
    again = pg.RunningMean(decay=0.5)
    again.load_state_dict(running.state_dict())
    assert (again.value, again.decay) == (pytest.approx(1.2), 0.9)


def test_scale_only_keeps_the_mean():
    x, mask = t([[1.0, 3.0], [5.0, 7.0]]), t([[1, 1], [1, 0]])
    # valid 1, 3, 5: mean 3, squared deviations 4 + 0 + 4 = 8, unbiased var 8/2 = 4, std 2
    close(pg.scale_only(x, mask), [[0.5, 1.5], [2.5, 3.5]], atol=1e-6)


# ---------------------------------------------------------------- group math


def test_rloo_advantages_by_hand():
    rewards = t([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])  # two groups of k = 3
    # group 1: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    # group 2: 0 - (0+3)/2 = -1.5 (twice), 3 - (0+0)/2 = 3
    close(pg.rloo_advantages(rewards, 3), [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0])
    # k = 2: each answer minus the other one
    close(pg.rloo_advantages(t([0.95, -0.1, 0.5, 0.3]), 2), [1.05, -1.05, 0.2, -0.2])
    with pytest.raises(ValueError, match="group_size >= 2"):
        pg.rloo_advantages(rewards, 1)
    with pytest.raises(ValueError, match="groups of 4"):
        pg.rloo_advantages(rewards, 4)


def test_grpo_advantages_by_hand():
    rewards = t([1.0, 3.0, 2.0, 2.0])  # two groups of k = 2
    # group 1: mean 2, unbiased std sqrt((1 + 1) / 1) = sqrt(2); group 2: std 0
    a = 1 / (math.sqrt(2) + 1e-4)
    close(pg.grpo_advantages(rewards, 2), [-a, a, 0.0, 0.0])
    # batch std: deviations -1, 1, 0, 0 -> unbiased var 2/3
    b = 1 / (math.sqrt(2 / 3) + 1e-4)
    close(pg.grpo_advantages(rewards, 2, "batch"), [-b, b, 0.0, 0.0])
    close(pg.grpo_advantages(rewards, 2, "none"), [-1.0, 1.0, 0.0, 0.0])
    # TRL's normalize_advantages: (x - 2) / (std 1 + 1e-4)
    close(pg.normalize(t([1.0, 2.0, 3.0])), [-1 / 1.0001, 0.0, 1 / 1.0001])


# ---------------------------------------------------------------- tiny-model helpers


def tiny_task(budget: int):
    return cory_env.custom_task(
        ["the movie was", "this film is", "i love the", "a very"],
        lambda queries, responses: [0.0] * len(responses),
        max_new_tokens=budget,
        context_length=24,
    )


def rollout_of(agent, tokenizer, batch: int, budget: int, seed: int = 0, group_size: int = 1):
    game = cory_env.batched_game(
        tiny_task(budget), batch_size=batch, n_agents=1, tokenizer=tokenizer, group_size=group_size
    )
    game.reset(seed=seed)
    play_batch(game, {"llm_0": agent})
    return agent.rollout


def token_logprobs(agent, rollout):
    """The model's log-prob of each response token now (no grad)."""
    ids, mask, pos = rollout.sequences()
    T = rollout.tokens.shape[1]
    with torch.no_grad():
        logits, _, _ = agent.model(ids, mask, pos, keep=T + 1)
    lp = torch.log_softmax(response_logits(logits, T), dim=-1)
    return lp.gather(-1, rollout.tokens[..., None]).squeeze(-1)


def spy_on_gradient_pass(agent, monkeypatch):
    """Record the batch tensors the learner hands the update (``agents/update.py``)."""
    seen = {}
    original = agent.update

    def spy(data, *args, **kwargs):
        seen.update(data)
        return original(data, *args, **kwargs)

    monkeypatch.setattr(agent, "update", spy)
    return seen


FIXED = {"init_kl_coef": 0.1, "adaptive_kl": False, "score_scaling": False, "learning_rate": 1e-3}


# ---------------------------------------------------------------- REINFORCE update


def test_reinforce_update_by_hand(tiny_tokenizer, tiny_lm, monkeypatch):
    cfg = ReinforceConfig(
        mini_batch_size=2, whiten_advantages=False, gamma=1.0, kl_penalty="full_in_reward", **FIXED
    )  # the KL's reward part by hand (the loss part: tests/test_kl_penalty.py)
    [policy], reference = build_policies(tiny_lm, 1)
    agent = ReinforceAgent(policy, reference, cfg, tiny_tokenizer.pad_token_id)
    ro = rollout_of(agent, tiny_tokenizer, batch=2, budget=2)
    assert ro.mask[0].tolist() == [1, 1], "the seed must give row 0 two tokens"
    ro = dataclasses.replace(
        ro, mask=torch.tensor([[1, 1], [1, 0]]), rewards=torch.tensor([1.0, 0.0])
    )
    agent.rollout = ro
    kl = torch.tensor([[0.5, 1.0], [2.0, 0.0]])
    unused = torch.zeros_like(kl)  # the reference's log-probs: REINFORCE and RLOO take none
    monkeypatch.setattr(agent.shaping, "reference_pass", lambda r, watch: (kl * r.mask, unused))
    seen = spy_on_gradient_pass(agent, monkeypatch)
    stats = agent.learn()
    # r_t = -0.1 KL_t, score at the last token: row 0 [-0.05, -0.1 + 1], row 1 [-0.2 + 0]
    # G: row 0 [0.85, 0.9], row 1 [-0.2]; b = (0.85 + 0.9 - 0.2) / 3 = 0.516667
    assert stats["reinforce/baseline"] == pytest.approx(1.55 / 3)
    expected = [[0.85 - 1.55 / 3, 0.9 - 1.55 / 3], [-0.2 - 1.55 / 3, 0.0]]
    close(seen["advantages"], expected, atol=1e-6)
    # loss = -mean over the 3 valid tokens of logprob * A (one on-policy mini-batch)
    lp, a = ro.logprobs.double(), t(expected)
    loss = -(lp[0, 0] * a[0, 0] + lp[0, 1] * a[0, 1] + lp[1, 0] * a[1, 0]) / 3
    assert stats["reinforce/loss"] == pytest.approx(float(loss), abs=1e-4)
    # summed KL per answer 1.5 and 2.0; non-score reward -0.1 * that
    assert stats["objective/kl"] == pytest.approx(1.75)
    assert stats["objective/non_score_reward"] == pytest.approx(-0.175)
    # The step raised the advantage-weighted log-likelihood of the answers.
    m = ro.mask.double()
    before = (lp * a * m).sum()
    after = (token_logprobs(agent, ro).double() * a * m).sum()
    assert after > before


def test_reinforce_baselines_and_their_state(tiny_tokenizer, tiny_lm, tmp_path):
    [policy], reference = build_policies(tiny_lm, 1)
    agent = ReinforceAgent(
        policy, reference, ReinforceConfig(baseline="running_mean"), tiny_tokenizer.pad_token_id
    )
    mask = t([[1, 1]])
    assert agent.baseline(t([[1.0, 3.0]]), mask) == 2.0  # no past yet: its own mean
    assert agent.baseline(t([[3.0, 5.0]]), mask) == 2.0  # the past batch's mean
    assert agent.running.value == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)
    rollout_of(agent, tiny_tokenizer, batch=2, budget=2)
    agent.learn()
    agent.save(tmp_path / "a")
    [policy2], _ = build_policies(tiny_lm, 1)
    fresh = ReinforceAgent(
        policy2, reference, ReinforceConfig(baseline="running_mean"), tiny_tokenizer.pad_token_id
    )
    fresh.load(tmp_path / "a")
    assert fresh.running.value == agent.running.value
    agent.config.baseline = "none"
    assert agent.baseline(t([[3.0, 5.0]]), mask) == 0.0
    with pytest.raises(SettingError, match="baseline"):
        ReinforceConfig(baseline="median").validate()


def test_critic_free_learners_leave_the_value_head_out(tiny_tokenizer, tiny_lm):
    [policy], reference = build_policies(tiny_lm, 1)
    agent = ReinforceAgent(policy, reference, ReinforceConfig(), tiny_tokenizer.pad_token_id)
    held = {id(p) for group in agent.optimizer.param_groups for p in group["params"]}
    assert held.isdisjoint(id(p) for p in agent.model.value_head.parameters())
    head = [p.clone() for p in agent.model.value_head.parameters()]
    rollout_of(agent, tiny_tokenizer, batch=2, budget=2)
    agent.learn()
    assert all(
        torch.equal(a, b) for a, b in zip(head, agent.model.value_head.parameters(), strict=True)
    )


# ---------------------------------------------------------------- RLOO and GRPO updates


def group_agent(cls, cfg, tokenizer, lm):
    [policy], reference = build_policies(lm, 1)
    return cls(policy, reference, cfg, tokenizer.pad_token_id, group_size=2)


def test_rloo_update_by_hand(tiny_tokenizer, tiny_lm, monkeypatch):
    cfg = RLOOConfig(
        mini_batch_size=4, ppo_epochs=1, whiten_advantages=False, kl_penalty="k1", **FIXED
    )  # the KL's reward part by hand, as TRL's RLOO (the loss part: tests/test_kl_penalty.py)
    agent = group_agent(RLOOAgent, cfg, tiny_tokenizer, tiny_lm)
    ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=1, group_size=2)
    agent.rollout = ro = dataclasses.replace(ro, rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]))
    kl = torch.tensor([[0.5], [1.0], [0.0], [2.0]])
    unused = torch.zeros_like(kl)  # the reference's log-probs: REINFORCE and RLOO take none
    monkeypatch.setattr(agent.shaping, "reference_pass", lambda r, watch: (kl * r.mask, unused))
    seen = spy_on_gradient_pass(agent, monkeypatch)
    stats = agent.learn()
    # KL in the reward: R = score - 0.1 * sum KL = [0.95, -0.1, 0.5, 0.3]
    # leave-one-out with k = 2: [0.95 + 0.1, -1.05, 0.5 - 0.3, -0.2]
    close(seen["advantages"], [1.05, -1.05, 0.2, -0.2])
    assert stats["rloo/rewards_mean"] == pytest.approx(1.65 / 4)
    # on-policy the sequence ratio is 1: loss = -mean(A) = 0, nothing clipped
    assert stats["rloo/loss"] == pytest.approx(0.0, abs=1e-4)
    assert stats["rloo/clipfrac"] == 0.0
    a = t([1.05, -1.05, 0.2, -0.2])
    before = (ro.logprobs.double().sum(1) * a).sum()
    after = (token_logprobs(agent, ro).double().sum(1) * a).sum()
    assert after > before


def test_grpo_update_by_hand(tiny_tokenizer, tiny_lm, monkeypatch):
    cfg = GRPOConfig(mini_batch_size=4, ppo_epochs=1, kl_penalty="k3_in_loss", **FIXED)  # TRL's
    agent = group_agent(GRPOAgent, cfg, tiny_tokenizer, tiny_lm)
    ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=1, group_size=2)
    agent.rollout = ro = dataclasses.replace(ro, rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]))
    kl = torch.tensor([[0.5], [1.0], [0.0], [2.0]])
    # The reference gives each sampled token 0.1 less log-prob than the policy.
    monkeypatch.setattr(
        agent.shaping, "reference_pass", lambda r, watch: (kl * r.mask, r.logprobs - 0.1)
    )
    seen = spy_on_gradient_pass(agent, monkeypatch)
    stats = agent.learn()
    # group 1: (1 - 0.5) / (sqrt(0.5) + 1e-4) = 0.70700..; group 2 has std 0: advantage 0
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    close(seen["advantages"], [a, -a, 0.0, 0.0])
    # beta times k3, with log r = logp_ref - logp = -0.1: exp(-0.1) - 1 + 0.1 = 0.0048374
    assert stats["grpo/loss_kl"] == pytest.approx(0.1 * (math.exp(-0.1) - 0.9), abs=1e-6)
    # ratio 1: policy loss -mean(A) = 0; total = 0 + beta 0.1 * k3
    assert stats["grpo/loss_policy"] == pytest.approx(0.0, abs=1e-4)
    assert stats["grpo/loss"] == pytest.approx(0.1 * (math.exp(-0.1) - 0.9), abs=1e-4)
    assert stats["objective/kl"] == pytest.approx(3.5 / 4)  # the KL controller's input
    assert stats["grpo/frac_reward_zero_std"] == 0.5
    adv = t([a, -a, 0.0, 0.0])
    before = (ro.logprobs.double().sum(1) * adv).sum()
    after = (token_logprobs(agent, ro).double().sum(1) * adv).sum()
    assert after > before


LEARNERS = {
    "reinforce": (ReinforceAgent, ReinforceConfig),
    "rloo": (RLOOAgent, RLOOConfig),
    "grpo": (GRPOAgent, GRPOConfig),
}


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_gradient_accumulation_gives_the_mini_batch_gradient(tiny_tokenizer, tiny_lm, name):
    """However a mini-batch is split into micro-batches (gradient accumulation) or chunks
    (``forward_batch_size``, the shared update's memory setting), its gradient is the same:
    each part is weighted by its share of the valid tokens (REINFORCE, GRPO) or rows (RLOO)."""
    cls, config = LEARNERS[name]
    ro = None
    grads = []
    splits = ((1, 16), (2, 16), (4, 16), (1, 1), (2, 1))  # (micro-batches, rows per forward)
    for steps, rows_per_forward in splits:
        epochs = {} if config is ReinforceConfig else {"ppo_epochs": 1}
        cfg = config(
            mini_batch_size=4,
            gradient_accumulation_steps=steps,
            forward_batch_size=rows_per_forward,
            **epochs,
            **FIXED,
        )
        [policy], reference = build_policies(tiny_lm, 1)
        extra = {} if cls is ReinforceAgent else {"group_size": 2}
        agent = cls(policy, reference, cfg, tiny_tokenizer.pad_token_id, **extra)
        agent.optimisation.steps_in_backward = lambda settings: False  # every gradient kept
        if ro is None:  # one rollout for all three, rows of 3, 1, 2 and 3 tokens
            ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=3, group_size=2)
            assert ro.tokens.shape[1] == 3
            mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
            ro = dataclasses.replace(ro, mask=mask, rewards=torch.tensor([1.0, 0.0, 0.5, 0.2]))
        agent.rollout = ro
        params = agent.model.trainable_parameters()
        agent.optimizer.step = lambda params=params: grads.append(
            [p.grad.clone() if p.grad is not None else None for p in params]
        )
        agent.learn()
    assert len(grads) == len(splits)
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_a_repetition_penalty_trains_the_distribution_sampled_from(
    tiny_tokenizer, tiny_lm, monkeypatch, name
):
    """As PPO: log-probs under the penalised distribution the tokens came from, so the
    first ratio is exactly 1 and REINFORCE's gradient is that of the policy that acted."""
    cls, config = LEARNERS[name]
    epochs = {} if config is ReinforceConfig else {"ppo_epochs": 1}
    cfg = config(mini_batch_size=4, repetition_penalty=1.3, **epochs, **FIXED)
    [policy], reference = build_policies(tiny_lm, 1)
    extra = {} if cls is ReinforceAgent else {"group_size": 2}
    agent = cls(policy, reference, cfg, tiny_tokenizer.pad_token_id, **extra)
    ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=4, group_size=2)
    assert not torch.allclose(ro.sample_logprobs, ro.logprobs)  # the penalty reshaped them
    agent.rollout = dataclasses.replace(ro, rewards=torch.tensor([1.0, 0.0, 0.5, 0.2]))
    seen = spy_on_gradient_pass(agent, monkeypatch)
    stats = agent.learn()
    if name == "reinforce":
        mask = ro.mask.float()
        loss = -(ro.sample_logprobs * seen["advantages"] * mask).sum() / mask.sum()
        assert stats["reinforce/loss"] == pytest.approx(float(loss), abs=1e-4)
    else:
        assert stats[f"{name}/ratio"] == pytest.approx(1.0, abs=1e-4)


def test_grpo_reference_pass_is_ppos_kl_plus_the_token_logprobs(tiny_tokenizer, tiny_lm):
    agent = group_agent(GRPOAgent, GRPOConfig(), tiny_tokenizer, tiny_lm)
    ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=3, group_size=2)
    kl, ref_logprobs = agent.reference_pass(ro)
    torch.testing.assert_close(kl, agent.reference_kl(ro))
    # before any update the policy is its reference: same log-probs, KL 0
    torch.testing.assert_close(ref_logprobs, ro.logprobs, atol=1e-4, rtol=0)
    assert kl.abs().max() < 1e-5


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_a_kl_coefficient_fixed_at_zero_skips_the_reference_and_trains_the_same(
    tiny_tokenizer, tiny_lm, name
):
    """At beta fixed at 0 (TRL's GRPO default) the reference pass would only be multiplied
    by 0: the update skips it and reports no KL, and its weights come out exactly as with
    the pass."""
    cls, config = LEARNERS[name]
    cfg = config(mini_batch_size=4, init_kl_coef=0.0, adaptive_kl=False, learning_rate=1e-3)
    groups = {} if cls is ReinforceAgent else {"group_size": 2}
    agents = []
    for _ in range(2):
        [policy], reference = build_policies(copy.deepcopy(tiny_lm), 1)
        agents.append(cls(policy, reference, cfg, tiny_tokenizer.pad_token_id, **groups))
    skipping, passing = agents
    passing.shaping.needs_reference_pass = True
    ro = rollout_of(skipping, tiny_tokenizer, batch=4, budget=3, group_size=2)
    ro = dataclasses.replace(ro, rewards=torch.tensor([1.0, 0.0, 0.2, 0.9]))

    def no_forward(*args, **kwargs):
        raise AssertionError("the reference ran a forward at beta fixed at 0")

    skipping.reference.logits = no_forward
    skipping.rollout, passing.rollout = ro, dataclasses.replace(ro)
    skipped, passed = skipping.learn(), passing.learn()
    assert "objective/kl" not in skipped and "objective/kl" in passed
    for a, b in zip(skipping.model.lm.parameters(), passing.model.lm.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(  # the update did move the weights
        not torch.equal(a, b)
        for a, b in zip(skipping.model.lm.parameters(), tiny_lm.parameters(), strict=True)
    )


def test_group_learners_refuse_a_game_without_groups(tmp_path):
    with pytest.raises(SettingError, match="rloo needs group_size >= 2"):
        build_config(overrides={"algorithm": "rloo", "group_size": 1})
    with pytest.raises(SettingError, match="llm_1 plays 'grpo': grpo needs group_size >= 2"):
        build_config(overrides={"learners": {"llm_0": "ppo", "llm_1": "grpo"}})
    with pytest.raises(SettingError, match="scale_rewards"):
        GRPOConfig(scale_rewards="sometimes").validate()


# ---------------------------------------------------------------- Elastic Reset


def test_ema_update_and_reset_by_hand():
    params = {"w": t([2.0, 2.0])}
    ema, initial = {"w": t([0.0, 4.0])}, {"w": t([-1.0, 1.0])}
    ema_update_(ema, params, 0.5)  # 0.5 * [0, 4] + 0.5 * [2, 2] = [1, 3]
    close(ema["w"], [1.0, 3.0])
    ema_update_(ema, params, 0.5)  # 0.5 * [1, 3] + 0.5 * [2, 2] = [1.5, 2.5]
    close(ema["w"], [1.5, 2.5])
    elastic_reset_(params, ema, initial)  # online <- EMA, EMA <- initial
    close(params["w"], [1.5, 2.5])
    close(ema["w"], [-1.0, 1.0])


def elastic(tokenizer, lm, decay=0.5, reset_freq=2):
    [policy], reference = build_policies(lm, 1)
    return ElasticReset(
        PPOAgent(policy, reference, PPOConfig(), tokenizer.pad_token_id), decay, reset_freq
    )


def test_elastic_reset_on_a_tiny_model_by_hand(tiny_tokenizer, tiny_lm, monkeypatch, tmp_path):
    with torch.no_grad():  # the initial model: every averaged weight 0
        for p in tiny_lm.parameters():
            p.zero_()
    er = elastic(tiny_tokenizer, tiny_lm)
    head = list(er.agent.model.value_head.parameters())
    assert not {id(p) for p in head} & {id(p) for p in er.params.values()}
    steps = iter([2.0, 4.0, 6.0])

    def fake_learn():  # "PPO" moves every weight, value head included, to a known value
        value = next(steps)
        with torch.no_grad():
            for p in er.agent.model.trainable_parameters():
                p.fill_(value)
        return {}

    monkeypatch.setattr(er.agent, "learn", fake_learn)
    some = next(iter(er.params))

    assert er.learn()["elastic_reset/reset"] == 0.0
    # online 2, EMA 0.5 * 0 + 0.5 * 2 = 1; no reset after 1 of 2 calls
    assert er.params[some].unique().tolist() == [2.0]
    assert er.ema[some].unique().tolist() == [1.0]
    assert er.learn()["elastic_reset/reset"] == 1.0
    # online 4, EMA 0.5 * 1 + 0.5 * 4 = 2.5; reset: online <- 2.5, EMA <- initial 0
    assert er.params[some].unique().tolist() == [2.5]
    assert er.ema[some].unique().tolist() == [0.0]
    assert all(p.unique().tolist() == [4.0] for p in head), "the value head is not reset"

    er.save(tmp_path / "er")
    with torch.no_grad():  # a fresh learner from another initial model
        for p in tiny_lm.parameters():
            p.fill_(9.0)
    fresh = elastic(tiny_tokenizer, tiny_lm)
    fresh.load(tmp_path / "er")
    assert fresh.learn_calls == 2
    for name in er.params:
        assert torch.equal(fresh.params[name], er.params[name])
        assert torch.equal(fresh.ema[name], er.ema[name])
        assert torch.equal(fresh.initial[name], er.initial[name])
    assert (tmp_path / "er" / "agent.json").read_text().count('"elastic_reset"') == 1
    with pytest.raises(CheckpointError, match="this seat plays 'ppo'"):
        [policy], reference = build_policies(tiny_lm, 1)
        PPOAgent(policy, reference, PPOConfig(), tiny_tokenizer.pad_token_id).load(tmp_path / "er")


def test_elastic_reset_averages_only_its_own_lora_adapter(tiny_tokenizer, tiny_lm):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    policies, _ = build_policies(tiny_lm, 2, lora)
    names = list(reset_parameters(policies[0]))
    assert len(names) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    assert all("lora_" in n and ".agent_0." in n for n in names)


# ---------------------------------------------------------------- the real run path


RUNS = {  # algorithm: (settings, a loss statistic of its learner)
    "reinforce": ({"learner": {"baseline": "running_mean"}}, "reinforce/loss"),
    "elastic_reset": ({"learner": {"reset_freq": 3}}, "ppo/loss_total"),
    "rloo": ({"group_size": 2}, "rloo/loss"),
    "grpo": ({"group_size": 2}, "grpo/loss"),
}


@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_trains_and_resumes_through_the_run_path(tiny_model_dir, tmp_path, algorithm):
    settings, loss = RUNS[algorithm]
    config = tiny_config(tiny_model_dir, tmp_path / "run", algorithm, iterations=2, **settings)
    first = run_training(config)
    config, resume = parse_args(["--resume", str(first.path), "--iterations", "3"], algorithm)
    run = run_training(config, resume)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all(np.isfinite(r["llm_0/kl"]) and np.isfinite(r[f"llm_0/{loss}"]) for r in rows)
    if algorithm == "elastic_reset":  # the 3rd call resets only if the count was restored
        assert [r["llm_0/elastic_reset/reset"] for r in rows] == [0.0, 0.0, 1.0]


def test_cli_mixes_learners_in_a_two_agent_game(tiny_model_dir, tmp_path):
    flags = tiny_flags(tiny_model_dir, tmp_path / "r", learners="{llm_0: ppo, llm_1: reinforce}")
    config, _ = parse_args(flags, "cory")
    rows = read_jsonl(run_training(config).path / "metrics.jsonl")
    assert "llm_0/ppo/loss_value" in rows[-1] and "llm_0/reinforce/loss" not in rows[-1]
    assert "llm_1/reinforce/loss" in rows[-1] and "llm_1/ppo/loss_value" not in rows[-1]
