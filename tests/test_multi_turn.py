"""Learners that learn from several turns an episode: returns and advantages over an agent's
turns checked against hand-computed values, the rollout a learner keeps of a game of several
rounds, and 2-round games trained, evaluated and resumed from the command line.

A game of one round is unchanged, seed by seed: ``tests/test_same_metrics.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cory_rl import run_training
from cory_rl.agents import turns
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.games import episode_rewards, play_games
from tests.conftest import read_jsonl, tiny_config


def scripted_episode():
    """One agent's 3 turns of a 2-agent, 3-round game, for 2 games, as a learner keeps them:
    one row per turn, turn after turn (rows 0-1 turn 0, 2-3 turn 1, 4-5 turn 2), right-padded
    to 2 tokens. Game 0's turns have 2, 1 and 2 tokens, game 1's 1, 2 and 1."""
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1], [1, 1], [1, 0]], dtype=torch.float)
    rewards = torch.tensor([[1, 0], [5, 0], [2, 0], [0, 0], [0, 4], [1, 0]], dtype=torch.float)
    values = torch.tensor([[1, 2], [1, 0], [1, 0], [3, 1], [2, 1], [2, 0]], dtype=torch.float)
    episode = torch.tensor([0, 1, 0, 1, 0, 1])
    turn = torch.tensor([0, 0, 1, 1, 2, 2])
    return rewards, values, mask, episode, turn


def test_gae_runs_over_an_agents_turns_by_hand():
    """Game 0's trajectory is its 5 tokens turn after turn: rewards [1, 0 | 2 | 0, 4],
    values [1, 2 | 1 | 2, 1]; gamma 0.5, lambda 0.5 (gamma * lambda = 0.25).

    delta_t = r_t + 0.5 V_{t+1} - V_t: [1 + 1 - 1, 0 + 0.5 - 2, 2 + 1 - 1, 0 + 0.5 - 2, 4 - 1]
    = [1, -1.5, 2, -1.5, 3]; the value at turn 1's first token (1) bootstraps turn 0's last
    token, and turn 2's (2) turn 1's. A_4 = 3, A_3 = -1.5 + 0.75 = -0.75,
    A_2 = 2 - 0.1875 = 1.8125, A_1 = -1.5 + 0.453125 = -1.046875,
    A_0 = 1 - 0.26171875 = 0.73828125; returns = A + V.
    Game 1: rewards [5 | 0, 0 | 1], values [1 | 3, 1 | 2]: delta = [5 + 1.5 - 1, 0 + 0.5 - 3,
    0 + 1 - 1, 1 - 2] = [5.5, -2.5, 0, -1]; A_3 = -1, A_2 = -0.25, A_1 = -2.5625,
    A_0 = 5.5 - 0.640625 = 4.859375."""
    rewards, values, mask, episode, turn = scripted_episode()
    advantages, returns = turns.gae(rewards, values, mask, 0.5, 0.5, episode, turn)
    expected = torch.tensor(
        [
            [0.73828125, -1.046875],
            [4.859375, 0.0],
            [1.8125, 0.0],
            [-2.5625, -0.25],
            [-0.75, 3.0],
            [-1.0, 0.0],
        ]
    )
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, (expected + values) * mask)


def test_returns_to_go_run_over_an_agents_turns_by_hand():
    """gamma 0.5. Game 0, rewards [1, 0 | 2 | 0, 4]: G = [1.75, 1.5 | 3 | 2, 4]. Game 1,
    rewards [5 | 0, 0 | 1]: G = [5.125 | 0.25, 0.5 | 1]."""
    rewards, _, mask, episode, turn = scripted_episode()
    returns = turns.returns_to_go(rewards, mask, 0.5, episode, turn)
    expected = torch.tensor([[1.75, 1.5], [5.125, 0], [3, 0], [0.25, 0.5], [2, 4], [1, 0]])
    torch.testing.assert_close(returns, expected)


def test_without_episodes_each_row_is_its_own_trajectory():
    """A game of one round: the row-wise functions, unchanged."""
    from cory_rl.agents import pg_math as pg
    from cory_rl.agents import ppo_math as pm

    rewards, values, mask, _, _ = scripted_episode()
    for ours, theirs in zip(
        turns.gae(rewards, values, mask, 0.9, 0.95),
        pm.gae(rewards, values, mask, 0.9, 0.95),
        strict=True,
    ):
        assert torch.equal(ours, theirs)
    assert torch.equal(
        turns.returns_to_go(rewards, mask, 0.9), pg.returns_to_go(rewards, mask, 0.9)
    )


def test_group_learners_credit_each_turn_with_its_return():
    """NaN is a turn not paid (0): [[-, -, 3], [1, -, 2]] -> [[3, 3, 3], [3, 2, 2]]."""
    nan = math.nan
    returns = turns.turn_returns(np.array([[nan, nan, 3.0], [1.0, nan, 2.0]]))
    assert returns.tolist() == [[3.0, 3.0, 3.0], [3.0, 2.0, 2.0]]


@pytest.mark.parametrize("pay_every_round", [False, True])
def test_a_learner_keeps_one_row_per_turn_and_learns_from_them(
    tiny_model_dir, tmp_path, pay_every_round
):
    """A 2-agent, 3-round game: each PPO learner keeps 3 turns of 4 games as 12 rows, turn
    after turn, a later turn's prompt showing the earlier answers; turns not paid get 0 and
    stay out of the score statistics; the update runs."""
    config = tiny_config(
        tiny_model_dir, tmp_path, rounds=3, pay_every_round=pay_every_round, max_new_tokens=3
    )
    game, learners = build_game_and_learners(config)
    game.reset(seed=0)
    play_games(game, learners, collect=True)
    rewards = episode_rewards(game, "llm_0")
    assert rewards.shape == (4, 3)
    assert np.isnan(rewards[:, :2]).all() != pay_every_round
    learner = learners["llm_0"]
    learner.end_rollout(game.observe("llm_0"), rewards)
    ro = learner.rollout
    assert ro.episode.tolist() == [0, 1, 2, 3] * 3
    assert ro.turn.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert ro.paid.tolist() == [pay_every_round] * 8 + [True] * 4
    assert learner.closed_turns == []
    prompt_lengths = ro.prompt_mask.sum(dim=1).view(3, 4)
    assert (prompt_lengths[1] > prompt_lengths[0]).all()  # they show the answers so far
    records = [t for t in game.turns if t.agent == "llm_0"]
    for k, record in enumerate(records):
        accepted = [len(ids) for ids in record.tokens]
        assert ro.mask[4 * k : 4 * (k + 1)].sum(dim=1).tolist() == accepted
    paid = np.stack(game.turn_rewards["llm_0"])  # (rounds, B): each turn's pay, in row order
    np.testing.assert_allclose(ro.rewards.numpy(), paid.reshape(-1), rtol=1e-6)
    scores = learner.shaping.scaled_rewards(ro)
    if not pay_every_round:
        assert (scores[:8] == 0).all()
        assert learner.shaping.score_moments.count == pytest.approx(4, abs=1e-3)
    learner.rollout = ro
    stats = learner.learn()
    assert all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize(
    ("algorithm", "settings"),
    [("cory", {}), ("reinforce", {}), ("grpo", {"group_size": 2})],
)
def test_two_round_games_train_evaluate_and_resume(tiny_model_dir, tmp_path, algorithm, settings):
    """CORY with a revision round (pioneer, observer, pioneer again, observer again), and the
    critic-free learners, trained, evaluated along training and resumed."""
    config = tiny_config(
        tiny_model_dir, tmp_path, algorithm=algorithm, rounds=2, eval_every=2, **settings
    )
    run = run_training(config)
    rows = read_jsonl(run.path / "metrics.jsonl")
    updates = [r for r in rows if "time/iteration_s" in r]
    evaluations = [r for r in rows if "eval/updates" in r]
    assert len(updates) == 3 and [r["eval/updates"] for r in evaluations] == [0, 2, 3]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
    config.iterations = 4
    run_training(config, resume=run.path)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert [r["iteration"] for r in rows if "time/iteration_s" in r] == [0, 1, 2, 3]


def test_dynamic_sampling_keeps_groups_of_one_query_and_turn(tiny_model_dir, tmp_path):
    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        algorithm="rloo",
        rounds=2,
        group_size=2,
        learner={"dynamic_sampling": True, "max_extra_batches": 2},
    )
    run = run_training(config)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert all(math.isfinite(r["llm_0/rloo/loss"]) for r in rows)


def test_a_learner_of_one_turn_an_episode_is_refused_a_game_of_several_rounds(tiny_tokenizer):
    from cory_env import batched_game
    from cory_env.checks import SettingError
    from cory_rl.agents.base import RandomLearner
    from cory_rl.train.core.games import check_multi_turn

    game = batched_game("imdb", batch_size=2, rounds=2, tokenizer=tiny_tokenizer)
    learners = {a: RandomLearner(len(tiny_tokenizer)) for a in game.possible_agents}
    with pytest.raises(SettingError, match=r"rounds 2: .*RandomLearner.*play rounds 1"):
        check_multi_turn(game, learners)
    one_round = batched_game("imdb", batch_size=2, tokenizer=tiny_tokenizer)
    check_multi_turn(one_round, learners)
