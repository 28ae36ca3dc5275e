"""One policy in several seats (``learners: {llm_0: ppo, llm_1: llm_0}``): one learner that
acts in each seat with that seat's observation, learns from all its turns in one update, and
is one agent in checkpoints, resume, export and cross-play; bad sharing refused first."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cory_env.checks import SettingError
from cory_rl import export, run_training
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.games import learner_rewards, play_games
from cory_rl.train.training.loop import play_batch
from tests.conftest import read_jsonl, tiny_config

SHARED = {"llm_0": "ppo", "llm_1": "llm_0"}


def test_the_command_line_seats_one_learner_in_both_seats(tiny_model_dir, tmp_path):
    config, _ = parse_args(
        ["--preset", "smoke", "--model", tiny_model_dir, "--learners", "{llm_0: ppo, llm_1: llm_0}"]
    )
    assert config.shared_seats() == {"llm_1": "llm_0"}
    assert config.seat_learners()["llm_1"] == config.seat_learners()["llm_0"]
    config = tiny_config(tiny_model_dir, tmp_path, learners=SHARED)
    game, learners = build_game_and_learners(config)
    assert learners["llm_1"] is learners["llm_0"] and learners["llm_0"].seats == 2


def test_a_shared_learner_learns_from_the_turns_of_both_seats(tiny_model_dir, tmp_path):
    """Each seat's turn is one episode of the update: 4 games x 2 seats = 8 rows, each paid
    its own seat's reward; evaluation reads each seat's own last turn."""
    config = tiny_config(tiny_model_dir, tmp_path, learners=SHARED, lam=0.0)
    game, learners = build_game_and_learners(config)
    learner = learners["llm_0"]
    game.reset(seed=0)
    play_batch(game, learners)
    ro = learner.rollout
    assert ro.episode.tolist() == list(range(8)) and ro.turn.tolist() == [0] * 8
    lengths = ro.mask.sum(dim=1).tolist()
    assert lengths[:4] == [len(ids) for ids in game.turns[0].tokens]
    assert lengths[4:] == [len(ids) for ids in game.turns[1].tokens]
    expected = np.concatenate([game.rewards["llm_0"], game.rewards["llm_1"]])
    np.testing.assert_allclose(ro.rewards.numpy(), expected, rtol=1e-6)
    rewards = learner_rewards(game, ["llm_0", "llm_1"])
    assert rewards.shape == (4, 2)
    stats = learner.learn()
    assert all(math.isfinite(v) for v in stats.values())

    game.reset(seed=1)
    play_games(game, learners)  # evaluation: nothing collected
    for agent, record in zip(game.possible_agents, game.turns, strict=True):
        seat = learner.turn_stats(game.observe(agent))
        assert seat["length"].tolist() == [len(ids) for ids in record.tokens]


def test_shared_cory_trains_resumes_and_is_one_agent(tiny_model_dir, tmp_path):
    """CORY's game played by one shared model: one checkpoint folder, one export, resumed;
    with rounds 2 it learns from 4 turns a game."""
    config = tiny_config(tiny_model_dir, tmp_path / "run", learners=SHARED, rounds=2, eval_every=3)
    run = run_training(config)
    assert sorted(p.name for p in (run.path / "checkpoint").iterdir()) == [
        "llm_0",
        "rng.safetensors",
        "state.json",
    ]
    rows = [r for r in read_jsonl(run.path / "metrics.jsonl") if "time/iteration_s" in r]
    assert rows[-1]["llm_0/kl"] == rows[-1]["llm_1/kl"]  # one learner's KL over all its turns
    config.iterations = 4
    run_training(config, resume=run.path)
    rows = [r for r in read_jsonl(run.path / "metrics.jsonl") if "time/iteration_s" in r]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    exported = export(run.path, tmp_path / "out")
    assert list(exported) == ["llm_0"]


@pytest.mark.parametrize(
    ("learners", "message"),
    [
        ({"llm_0": "llm_1", "llm_1": "llm_0"}, "shares another's"),
        ({"llm_0": "llm_0", "llm_1": "ppo"}, "llm_0 names itself"),
        ({"llm_0": "ppo", "llm_1": "llm_7"}, "a seat this 2-agent game does not have"),
        ({"llm_0": "ppo", "llm_1": "llm_0", "llm_2": "llm_1"}, r"llm_2 -> llm_1 -> llm_0"),
    ],
)
def test_bad_sharing_is_refused_before_any_model_loads(
    tiny_model_dir, tmp_path, no_model_load, learners, message
):
    with pytest.raises(SettingError, match=message):
        config = tiny_config(
            tiny_model_dir, tmp_path / "run", learners=learners, n_agents=len(learners)
        )
        run_training(config)


def test_a_shared_seat_plays_its_owners_model(tiny_model_dir, tmp_path, no_model_load):
    with pytest.raises(SettingError, match="plays llm_0's model"):
        tiny_config(tiny_model_dir, tmp_path, learners=SHARED, models={"llm_1": "embedded"})


def test_each_seats_turns_of_a_game_are_one_episode(tiny_model_dir, tmp_path):
    """2 rounds, turns played pioneer, observer, pioneer, observer: the pioneer's turns of
    game b are episode b, the observer's episode 4 + b, each numbered 0 then 1."""
    config = tiny_config(tiny_model_dir, tmp_path, learners=SHARED, rounds=2)
    game, learners = build_game_and_learners(config)
    game.reset(seed=0)
    play_batch(game, learners)
    ro = learners["llm_0"].rollout
    assert ro.episode.tolist() == [0, 1, 2, 3, 4, 5, 6, 7] * 2
    assert ro.turn.tolist() == [0] * 8 + [1] * 8
    assert ro.paid.tolist() == [False] * 8 + [True] * 8
