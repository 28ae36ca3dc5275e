"""Two-player TextArena games as a task: scripted matches through the batched game and the
AEC env (TextArena's rules, its invalid-move handling, results paid in the round a match
ends), PettingZoo's API test, self-play with one shared policy from the command line, and
bad input refused in one line before any model loads."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import api_test

import cory_env
from cory_env import batched_game
from cory_env.checks import SettingError
from cory_rl import run_training
from cory_rl.agents.rollout import Rollout
from cory_rl.agents.turns import without_empty_turns
from tests.conftest import load_script, read_jsonl, tiny_config

pytest.importorskip("textarena")  # the dev extra installs it; CI runs these tests


@pytest.fixture(scope="module")
def real_tok():
    return cory_env.load_tokenizer("embedded")


def play_script(game, tok, script):
    """Play one batch, row b's acting player writing ``script[b]``'s next move (EOS when
    its moves run out)."""
    cursor = [0] * game.batch_size
    plans, step = [], 0
    while not game.done:
        agent = game.agent_selection
        if (game.observe(agent)["num_generated"] == 0).all():
            plans, step = [], 0
            for b, moving in enumerate(game._moving):
                if moving and cursor[b] < len(script[b]):
                    plans.append(tok(" " + script[b][cursor[b]])["input_ids"] + [tok.eos_token_id])
                    cursor[b] += 1
                else:
                    plans.append([tok.eos_token_id])
        game.step(np.array([p[min(step, len(p) - 1)] for p in plans]), agent=agent)
        step += 1


def test_scripted_matches_follow_textarenas_rules(real_tok):
    """Row 0: O takes 4, 1, 7 (a column) against X's 0, 8: player 0 wins in round 2. Row 1:
    player 1 writes no move (TextArena lets it retry, so player 0's next turn in that row is
    empty), then takes the occupied cell 4: a second invalid move loses, in round 1."""
    game = batched_game("textarena", batch_size=2, rounds=5, lam=0.0, tokenizer=real_tok)
    game.reset(seed=0)
    script = [["[4]", "[0]", "[1]", "[8]", "[7]"], ["[4]", "hello", "[4]"]]
    play_script(game, real_tok, script)
    turns = [(t.round, t.agent, t.responses) for t in game.turns[:4]]
    assert turns == [
        (0, "llm_0", [" [4]", " [4]"]),
        (0, "llm_1", [" [0]", " hello"]),
        (1, "llm_0", [" [1]", ""]),  # row 1 waits on player 1's retry
        (1, "llm_1", [" [8]", " [4]"]),
    ]
    assert all(t.responses == ["", ""] for t in game.turns[6:])  # both matches over
    paid = {a: np.stack(r, axis=1).tolist() for a, r in game.turn_rewards.items()}
    assert paid["llm_0"] == [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]
    assert paid["llm_1"] == [[0, 0, -1, 0, 0], [0, -1, 0, 0, 0]]
    assert game.scores["llm_0"].tolist() == [1, 1] and game.scores["llm_1"].tolist() == [-1, -1]
    stats = game.match_stats()
    assert stats["valid_move_rate"] == pytest.approx(6 / 8)
    assert (stats["finished"], stats["player_0_win_rate"], stats["draw_rate"]) == (1, 1, 0)


def test_role_exchange_seats_the_other_agent_as_player_0(real_tok):
    game = batched_game(
        "textarena", batch_size=1, rounds=3, lam=0.0, role_exchange_period=1, tokenizer=real_tok
    )
    game.reset(seed=0)
    play_script(game, real_tok, [["[4]", "[0]"]])
    game.reset()  # episode 1: llm_1 is the pioneer, player 0
    assert game.agent_selection == "llm_1"
    assert "You are Player 0" in real_tok.decode(game.observe("llm_1")["input_ids"][0])


def test_empty_turns_leave_the_update_and_pass_their_pay_back():
    """One episode's turns with 2, 0 (waited) and 1 tokens, the empty one paid 1: it goes to
    turn 0, the latest earlier turn with tokens."""
    import torch

    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    zeros = torch.zeros(3, 2)
    rollout = Rollout(
        torch.zeros(3, 1, dtype=torch.long),
        torch.ones(3, 1, dtype=torch.long),
        torch.zeros(3, 2, dtype=torch.long),
        mask,
        zeros,
        zeros,
        zeros,
        None,
        torch.tensor([0.0, 1.0, 0.5]),
        episode=torch.tensor([0, 0, 0]),
        turn=torch.tensor([0, 1, 2]),
        paid=torch.tensor([False, True, True]),
    )
    kept = without_empty_turns(rollout)
    assert kept.turn.tolist() == [0, 2]
    assert kept.rewards.tolist() == [1.0, 0.5] and kept.paid.tolist() == [True, True]


@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
def test_the_aec_env_passes_the_api_test(real_tok):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = cory_env.text_game(
            task="textarena", rounds=3, lam=0.0, max_new_tokens=2, tokenizer=real_tok
        )
        api_test(env, num_cycles=40)


def test_self_play_with_one_shared_policy_trains(tiny_model_dir, tmp_path):
    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        task="textarena",
        learners={"llm_0": "ppo", "llm_1": "llm_0"},
        lam=0.0,
        rounds=5,
        max_new_tokens=2,
        iterations=2,
    )
    run = run_training(config)
    rows = [r for r in read_jsonl(run.path / "metrics.jsonl") if "time/iteration_s" in r]
    assert len(rows) == 2
    assert 0 <= rows[-1]["game/valid_move_rate"] <= 1
    assert math.isfinite(rows[-1]["llm_0/ppo/loss_total"])
    # examples/textarena_vs_base.py: the trained policy, then the base, against the base
    example = load_script(Path(__file__).resolve().parents[1] / "examples/textarena_vs_base.py")
    for base in (False, True):
        figures = example.measure(run.path, base, matches=4, batch_size=2)
        assert figures["matches"] == 4
        rates = ("win_rate", "draw_rate", "loss_rate", "unfinished_rate")
        assert sum(figures[k] for k in rates) == pytest.approx(1)
        assert 0 <= figures["valid_move_rate"] <= 1


@pytest.mark.parametrize("learner", ["ppo", "reinforce", "elastic_reset", "rloo", "grpo"])
def test_every_learner_takes_a_seat_whose_match_can_end_before_its_turn(
    learner, tiny_model_dir, tmp_path
):
    """A match over before a seat's turn leaves that seat's answer empty: the learner leaves
    the row out of its update (or, grouped, weighs it zero), whatever the rounds."""
    for rounds in (1, 3):
        config = tiny_config(
            tiny_model_dir,
            tmp_path / f"rounds_{rounds}",
            task="textarena",
            learners={"llm_0": learner, "llm_1": learner},
            lam=0.0,
            rounds=rounds,
            group_size=2 if learner in ("rloo", "grpo") else 1,
            max_new_tokens=2,
            iterations=2,
        )
        run = run_training(config)
        rows = [r for r in read_jsonl(run.path / "metrics.jsonl") if "time/iteration_s" in r]
        assert len(rows) == 2
        losses = [v for r in rows for k, v in r.items() if k.endswith("loss") or "/loss_" in k]
        assert all(math.isfinite(v) for v in losses)
        if rounds == 1:  # the first seat's invalid moves ended matches before the second's
            assert rows[0]["game/valid_move_rate"] < 1


@pytest.mark.parametrize(
    ("settings", "game", "message"),
    [
        ({"env_id": "TicTacToe-v9"}, {"lam": 0.0}, "not a TextArena game; close: "),
        ({"env_id": "FrozenLake-v0"}, {"lam": 0.0}, "not a two-player game"),
        ({}, {"lam": 1.0}, "set --lam 0"),
        ({}, {"lam": 0.0, "n_agents": 3}, "2-player game: set n_agents 2"),
    ],
)
def test_bad_input_is_one_line(real_tok, settings, game, message):
    with pytest.raises(SettingError, match=message):
        batched_game("textarena", batch_size=2, tokenizer=real_tok, **game, **settings)


def test_a_missing_textarena_says_how_to_install_it(monkeypatch, tiny_model_dir, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "textarena" else real(name)
    )
    config = tiny_config(tiny_model_dir, tmp_path, task="textarena", lam=0.0)
    with pytest.raises(SettingError, match=r"pip install 'cory\[textarena\]'"):
        run_training(config)
