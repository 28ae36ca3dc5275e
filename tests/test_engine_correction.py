"""The off-policy correction of engine samples (agents/engine_correction.py): its maths on
hand-computed values, and its effect on every LLM learner when the engine samples from
another distribution than the learner's (a tempered copy of the model)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import cory_env
from cory_env.checks import SettingError
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
from cory_rl.agents.policy import build_policies
from cory_rl.agents.ppo import PPOAgent, PPOConfig
from cory_rl.agents.reinforce import ReinforceAgent, ReinforceConfig
from cory_rl.agents.rollout import concat_rollouts
from cory_rl.train.training.loop import play_batch
from tests.test_engine import CopyEngine
from tests.test_ppo_agent import target_task

# Learner minus engine log-probs whose ratios are, row 0: 1, 4, 0.5; row 1: 2, 1.25, padding.
RATIOS = torch.tensor([[1.0, 4.0, 0.5], [2.0, 1.25, 7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ENGINE = torch.full((2, 3), -1.0)
LEARNER = ENGINE + RATIOS.log()


def weights(mode, cap=3.0, floor=None, engine=ENGINE):
    return ec.correction_weights(LEARNER, engine, MASK, mode, cap, floor)


def test_token_truncate_clips_each_token_s_ratio_at_the_cap():
    w, stats = weights("token_truncate")
    torch.testing.assert_close(w, torch.tensor([[1.0, 3.0, 0.5], [2.0, 1.25, 1.0]]))
    expected = {
        "engine/is_ratio_mean": 8.75 / 5,
        "engine/is_ratio_min": 0.5,
        "engine/is_ratio_max": 4.0,
        "engine/is_weight_mean": 7.75 / 5,
        "engine/is_clipped_frac": 1 / 5,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(stats[key], value, rel_tol=1e-6), key
    w, _ = weights("token_truncate", floor=0.8)  # raised to the floor as well
    torch.testing.assert_close(w, torch.tensor([[1.0, 3.0, 0.8], [2.0, 1.25, 1.0]]))


def test_token_mask_zeroes_tokens_outside_floor_and_cap():
    w, stats = weights("token_mask", floor=0.6)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0], [2.0, 1.25, 1.0]]))
    assert math.isclose(stats["engine/is_clipped_frac"], 2 / 5, rel_tol=1e-6)
    assert math.isclose(stats["engine/is_weight_mean"], 4.25 / 5, rel_tol=1e-6)


def test_sequence_modes_weigh_each_answer_by_its_tokens_product():
    w, stats = weights("sequence_truncate")  # answers' ratios 1*4*0.5 = 2 and 2*1.25 = 2.5
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0], [2.5, 2.5, 1.0]]))
    assert stats["engine/is_clipped_frac"] == 0.0
    w, stats = weights("sequence_truncate", cap=2.2)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0], [2.2, 2.2, 1.0]]))
    assert math.isclose(stats["engine/is_ratio_mean"], 2.25, rel_tol=1e-6)
    assert math.isclose(stats["engine/is_weight_mean"], 2.1, rel_tol=1e-6)
    assert stats["engine/is_clipped_frac"] == 0.5  # one answer of two
    w, _ = weights("sequence_mask", cap=2.2)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 1.0]]))


def test_a_missing_engine_logprob_counts_as_agreement():
    engine = ENGINE.clone()
    engine[0, 1] = float("nan")
    w, _ = weights("token_truncate", engine=engine)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 0.5], [2.0, 1.25, 1.0]]))


def test_losses_take_the_weights_and_nothing_changes_without_them():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert ec.weighted(per_token, {}) is per_token
    assert ec.weighted_answers(per_token[:, :1], {}, MASK) is not None
    w = torch.tensor([[1.0, 3.0, 0.5], [2.0, 0.0, 9.0]])
    mb = {ec.WEIGHTS: w}
    torch.testing.assert_close(ec.weighted(per_token, mb), per_token * w)
    answers = torch.tensor([[1.0], [-2.0], [5.0]])
    mb = {ec.WEIGHTS: torch.tensor([[1.0, 3.0, 0.5], [2.0, 0.0, 9.0], [4.0, 4.0, 4.0]])}
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    # the mean weight over each answer's tokens; an answer without tokens keeps weight 1
    expected = torch.tensor([[1.0 * 4.5 / 3], [-2.0 * 1.0], [5.0]])
    torch.testing.assert_close(ec.weighted_answers(answers, mb, mask), expected)


def test_ppo_s_policy_loss_weighs_each_token():
    logprobs = torch.tensor([[-1.0, -2.0]])  # ratio 1: the loss is -A per token
    advantages, mask = torch.tensor([[1.0, -2.0]]), torch.ones(1, 2)
    plain, _ = pm.policy_loss(logprobs, logprobs, advantages, mask)
    corrected, _ = pm.policy_loss(
        logprobs, logprobs, advantages, mask, weights=torch.tensor([[2.0, 0.5]])
    )
    assert math.isclose(float(plain), 0.5) and math.isclose(float(corrected), -0.5)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"engine_correction": "yes"}, "engine_correction"),
        ({"engine_correction_mode": "token"}, "engine_correction_mode"),
        ({"engine_correction_cap": 0}, "engine_correction_cap"),
        ({"engine_correction_floor": 4.0}, "engine_correction_floor"),
        ({"engine_correction_cap": None}, "both None"),
    ],
)
def test_the_settings_are_checked(bad, match):
    with pytest.raises(SettingError, match=match):
        PPOConfig(**bad).validate()
    PPOConfig(engine_correction_cap=None, engine_correction_floor=0.1).validate()


def test_a_batch_without_the_engine_joins_one_with_it_at_ratio_one():
    from tests.test_dynamic_sampling import rollout

    engine_part = rollout([1.0, 0.0])
    engine_part.engine_logprobs = engine_part.sample_logprobs - 0.5
    both = concat_rollouts([engine_part, rollout([0.0, 1.0], width=3)], pad_token_id=0)
    torch.testing.assert_close(both.engine_logprobs[:2, :2], engine_part.engine_logprobs)
    torch.testing.assert_close(both.engine_logprobs[2:], both.sample_logprobs[2:])


# ---------------------------------------------------------------- an engine off the policy


LEARNERS = {
    "ppo": (PPOAgent, PPOConfig, {}),
    "reinforce": (ReinforceAgent, ReinforceConfig, {}),
    "rloo": (RLOOAgent, RLOOConfig, {"group_size": 2}),
    "grpo": (GRPOAgent, GRPOConfig, {"group_size": 2}),
}


def varied_task(tokenizer):
    """Rewards that differ between answers (within each group too), whatever the model."""
    return cory_env.custom_task(
        ["the movie was", "this film is", "i love the", "a very"],
        lambda queries, responses: [len(r) % 5 / 5 for r in responses],
        prompt_fn=lambda role, q, earlier: q.text,
        max_new_tokens=4,
        context_length=24,
    )


def learner_on_a_tempered_engine(name, tokenizer, lm, **settings):
    """A learner of ``name`` that played one batch of 8 games from a tempered engine."""
    cls, config_cls, extra = LEARNERS[name]
    config = config_cls(learning_rate=1e-2, mini_batch_size=8, **settings)
    [policy], reference = build_policies(copy.deepcopy(lm), 1)
    agent = cls(policy, reference, config, tokenizer.pad_token_id, seed=0, **extra)
    agent.attach_engine(CopyEngine(lm, temperature=0.5), tokenizer.eos_token_id)
    k = extra.get("group_size", 1)
    game = cory_env.batched_game(
        varied_task(tokenizer), batch_size=8, n_agents=1, tokenizer=tokenizer, group_size=k
    )
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    return agent


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_an_engine_off_the_policy_is_corrected_in_every_learner_s_update(
    name, tiny_tokenizer, tiny_lm
):
    corrected = learner_on_a_tempered_engine(name, tiny_tokenizer, tiny_lm)
    plain = learner_on_a_tempered_engine(name, tiny_tokenizer, tiny_lm, engine_correction=False)
    torch.testing.assert_close(corrected.rollout.tokens, plain.rollout.tokens, rtol=0, atol=0)
    ro = corrected.rollout
    stats = corrected.learn()
    w = ro.is_weights[ro.mask.bool()]
    assert (w - 1).abs().max() > 0.05, "the tempered engine should be off the learner's policy"
    for key in (
        "is_ratio_mean",
        "is_ratio_min",
        "is_ratio_max",
        "is_weight_mean",
        "is_clipped_frac",
        "kl",
    ):
        assert math.isfinite(stats[f"engine/{key}"]), key
    assert stats["engine/is_ratio_min"] < 1 < stats["engine/is_ratio_max"]
    plain_stats = plain.learn()
    assert plain.rollout is None and "engine/is_ratio_mean" not in plain_stats
    pairs = zip(corrected.model.lm.parameters(), plain.model.lm.parameters(), strict=True)
    moved = [float((a - b).detach().abs().max()) for a, b in pairs]  # both started from tiny_lm
    assert max(moved) > 1e-6, "the correction did not change the update"


def test_without_an_engine_the_batch_has_no_weights(tiny_tokenizer, tiny_lm):
    [policy], reference = build_policies(tiny_lm, 1)
    agent = PPOAgent(policy, reference, PPOConfig(mini_batch_size=4), 0, seed=0)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=4, n_agents=1, tokenizer=tiny_tokenizer
    )
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    ro = agent.take_rollout()
    assert ro.engine_logprobs is None and ro.is_weights is None
    assert ec.WEIGHTS not in ro.batch_tensors()
