"""Other RL libraries play the game: the small-vocabulary mode, the single-seat gymnasium view,
Stable-Baselines3 in the observer seat and TorchRL training both seats (examples/)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import api_test, seed_test

import cory_env
from cory_env import SMALL_VOCAB_ARITH, ArithScriptedPlayer, small_vocab_tokenizer
from cory_env.small_vocab import CHARSETS, evaluate_expression
from cory_env.tasks import make_task
from cory_env.tasks.arith import generate_arith_problems
from tests.conftest import load_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (examples/ is not a package)."""
    return load_script(EXAMPLES / f"{name}.py")


@pytest.fixture(scope="module")
def tok():
    return small_vocab_tokenizer()


def small_seat(tok, seat="llm_1", others=None, **settings):
    values = {**SMALL_VOCAB_ARITH, "role_exchange_period": 10**9, **settings}
    return cory_env.single_seat("arith", seat=seat, others=others, tokenizer=tok, **values)


# ---------------------------------------------------------------- 1. small vocabulary


def test_small_vocab_tokenizer_is_a_real_character_tokenizer(tok, tmp_path) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) == 3 + len(CHARSETS["equation"]) == 21
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    ids = tok("3+4[7]=")["input_ids"]
    assert len(ids) == 7 and tok.unk_token_id not in ids  # one token per character, no BOS/EOS
    assert tok.decode(ids) == "3+4[7]="
    assert tok.decode([*tok("12")["input_ids"], 1, 0, 2], skip_special_tokens=True) == "12"
    assert tok("3 x")["input_ids"] == [tok.convert_tokens_to_ids("3"), 2, 2]  # unknown chars
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("(3+4)*2=")["input_ids"] == tok("(3+4)*2=")["input_ids"]
    text = small_vocab_tokenizer("text")
    word_prompts = make_task("arith", n_queries=50).prompt
    for query in make_task("arith", n_queries=50).queries:
        prompt = word_prompts(1, query, [" The answer is 7."])
        assert text.decode(text(prompt)["input_ids"]) == prompt  # covers the word problems
    with pytest.raises(ValueError, match="repeats the characters \\['1'\\]"):
        small_vocab_tokenizer("0121")
    with pytest.raises(ValueError, match="charset must be one of"):
        small_vocab_tokenizer("")


def test_equation_style_writes_the_same_problems_compactly() -> None:
    kwargs = {"max_operand": 9, "n_steps": 3, "operations": ("+", "-", "*"), "seed": 5}
    words = generate_arith_problems(200, **kwargs)
    equations = generate_arith_problems(200, style="equation", **kwargs)
    assert [q.answer for q in words] == [q.answer for q in equations]
    for query in equations:
        assert evaluate_expression(query.text) == int(query.answer), query.text
        assert set(query.text) <= set(CHARSETS["equation"])
    task = make_task("arith", style="equation", n_queries=4)
    assert (task.context_length, task.max_new_tokens) == (16, 4)
    query = task.queries[0]
    assert task.prompt(0, query, []) == f"{query.text}="
    assert task.prompt(2, query, [" 7", "8"]) == f"{query.text}[7][8]="
    assert task.score([query], [query.answer]) == [1.0]
    default = make_task("arith", n_queries=4)  # the default task is unchanged
    assert (default.context_length, default.max_new_tokens) == (192, 24)
    assert default.metadata["style"] == "words"
    with pytest.raises(ValueError, match="style must be one of \\['words', 'equation'\\]"):
        make_task("arith", style="latex")


def test_small_vocab_game_fits_and_a_right_answer_scores(tok) -> None:
    game = cory_env.batched_game("arith", batch_size=64, tokenizer=tok, **SMALL_VOCAB_ARITH)
    assert game.context_length == 10 and (game.budget_low, game.budget_high) == (2, 2)
    assert game.action_space("llm_0").n == 21
    # Every answer is one digit; the longest observer prompt ("4+4[12]=") fits the window.
    assert {q.answer for q in game.task.queries} <= set("012345678")
    oracle = ArithScriptedPlayer(tok, p_correct=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no prompt is cut
        for episode in range(2):  # each seat in each role
            game.reset(seed=episode)
            while not game.done:
                agent = game.agent_selection
                game.step(oracle.act(game.observe(agent)), agent=agent)
            for agent in game.possible_agents:
                assert game.scores[agent].tolist() == [1.0] * 64
                assert game.rewards[agent].tolist() == [2.0] * 64  # lam=1: both right
        obs = game.observe(game.agents_by_role[1])
        assert tok.decode(obs["input_ids"][0], skip_special_tokens=True).endswith(
            f"[{game.responses[game.agents_by_role[0]][0]}]={game.responses[game.agents_by_role[1]][0]}"
        )
    assert tok.unk_token_id not in game.observe("llm_0")["input_ids"]


@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
def test_small_vocab_aec_env_passes_pettingzoo_tests(tok) -> None:
    def make():
        return cory_env.text_game("arith", tokenizer=tok, **SMALL_VOCAB_ARITH)

    api_test(make(), num_cycles=20)
    seed_test(make, num_cycles=20)


def test_scripted_player_is_right_as_often_as_asked(tok) -> None:
    player = ArithScriptedPlayer(tok, p_correct=0.5, seed=3)
    answers = [player.answer_for("2+3=") for _ in range(2000)]
    right = np.mean([a == "5" for a in answers])
    assert abs(right - 0.5) < 0.05  # 5 standard deviations of a 2000-draw binomial
    assert {a for a in answers if a != "5"} == set("012346789")
    assert ArithScriptedPlayer(tok).answer_for("(1+2)*3[9]=") == "9"
    assert evaluate_expression("__import__('os')") is None
    with pytest.raises(ValueError, match="p_correct must be a finite number"):
        ArithScriptedPlayer(tok, p_correct=1.5)


# ---------------------------------------------------------------- 2. one seat as a gym env


@pytest.mark.filterwarnings("ignore:.*render")
@pytest.mark.parametrize("seat", ["llm_0", "llm_1"])
@pytest.mark.parametrize("kind", ["random", "callable", "learner", "scripted"])
def test_single_seat_passes_gymnasium_env_checker(tok, seat, kind) -> None:
    other = "llm_1" if seat == "llm_0" else "llm_0"
    policies = {
        "random": "random",
        "callable": lambda obs: int(obs["input_ids"][-1]) % 21,  # deterministic in obs
        "learner": LastTokenLearner(),
        "scripted": ArithScriptedPlayer(tok, p_correct=0.7),
    }
    env = small_seat(tok, seat=seat, others={other: policies[kind]}, render_mode="ansi")
    check_env(env, skip_render_check=False)
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    sb3_check_env(env, warn=False)


class LastTokenLearner:
    """A deterministic learner-style policy: batched ``act`` (as agents/base.py's protocol)."""

    def act(self, obs):
        return (obs["input_ids"][:, -1] + obs["num_generated"]) % 21


def test_single_seat_takes_a_protocol_learner_as_a_partner(tok) -> None:
    from cory_rl.agents.base import Learner, RandomLearner

    partner = RandomLearner(vocab_size=21, seed=0)
    assert isinstance(partner, Learner)
    env = small_seat(tok, others={"llm_0": partner})
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, info = env.step(1)
    assert set(info["scores"]) == {"llm_0", "llm_1"}


def test_single_seat_plays_the_game_and_pays_at_the_end(tok) -> None:
    pioneer = ArithScriptedPlayer(tok, p_correct=1.0)
    env = small_seat(tok, others={"llm_0": pioneer}, render_mode="ansi")
    obs, info = env.reset(seed=0)
    assert info["role"] == "observer" and obs["role"] == 1 and obs["num_generated"] == 0
    prompt = tok.decode(obs["input_ids"], skip_special_tokens=True)
    expression = info["query"]
    assert prompt == f"{expression}[{evaluate_expression(expression)}]="  # the pioneer answered
    answer = str(evaluate_expression(expression))
    obs, reward, terminated, truncated, info = env.step(tok.convert_tokens_to_ids(answer))
    assert (reward, terminated, truncated) == (0.0, False, False) and obs["num_generated"] == 1
    obs, reward, terminated, truncated, info = env.step(tok.eos_token_id)
    assert terminated and not truncated
    assert info["scores"] == {"llm_0": 1.0, "llm_1": 1.0} and reward == 2.0  # lam=1
    assert info["responses"]["llm_1"] == answer
    assert "llm_1 [observer]" in env.render()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(3)
    # reward="score": the seat's own task score, not the game's pay (which adds the pioneer's).
    env = small_seat(tok, others={"llm_0": pioneer}, reward="score")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(tok.eos_token_id)  # an empty answer
    assert terminated and reward == 0.0 and info["scores"] == {"llm_0": 1.0, "llm_1": 0.0}
    assert env.game.rewards["llm_1"][0] == 1.0  # what reward="game" would have paid


def test_single_seat_as_pioneer_lets_the_observer_play_after_it(tok) -> None:
    calls = []

    def observer(obs):
        calls.append(int(obs["num_generated"]))
        return 1  # EOS at once

    env = small_seat(tok, seat="llm_0", others={"llm_1": observer})
    obs, info = env.reset(seed=1)
    assert info["role"] == "pioneer" and not calls
    env.step(5)
    _, reward, terminated, _, info = env.step(1)
    assert terminated and calls == [0] and info["responses"]["llm_1"] == ""
    assert reward == info["scores"]["llm_0"] + info["scores"]["llm_1"]


def test_single_seat_seeds_fix_the_game_and_roles_rotate(tok) -> None:
    def play(env, seed):
        obs, info = env.reset(seed=seed)
        return info["query"], obs["input_ids"].tolist(), info["role"]

    env = small_seat(tok, others={"llm_0": ArithScriptedPlayer(tok, p_correct=0.5)})
    assert play(env, 7) == play(env, 7)
    rotating = small_seat(tok, role_exchange_period=1)
    roles = [rotating.reset(seed=0)[1]["role"]] + [rotating.reset()[1]["role"] for _ in range(3)]
    assert roles == ["observer", "pioneer", "observer", "pioneer"]
    assert rotating.reset(options={"episode": 1})[1]["role"] == "pioneer"


def test_single_seat_refuses_bad_input(tok) -> None:
    with pytest.raises(ValueError, match="seat must be one of .*'llm_0', 'llm_1'.*'llm_2'"):
        small_seat(tok, seat="llm_2")
    with pytest.raises(ValueError, match="missing \\['llm_0'\\], unknown \\['llm_1'\\]"):
        small_seat(tok, others={"llm_1": "random"})
    with pytest.raises(TypeError, match="policy for llm_0 must be 'random'"):
        small_seat(tok, others={"llm_0": 3})
    with pytest.raises(ValueError, match="reward must be one of"):
        small_seat(tok, reward="kl")
    game = cory_env.batched_game("arith", batch_size=2, tokenizer=tok, **SMALL_VOCAB_ARITH)
    with pytest.raises(ValueError, match="batch_size=2"):
        cory_env.single_seat(game)
    with pytest.raises(ValueError, match="group_size must be 1"):
        small_seat(tok, group_size=2)
    env = small_seat(tok)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one token id"):
        env.step([3, 4])
    with pytest.raises(ValueError, match="action 99 for llm_1 at row 0 is not a token id"):
        env.step(99)
    aec = cory_env.text_game("arith", tokenizer=tok, **SMALL_VOCAB_ARITH)
    assert cory_env.single_seat(aec).game is aec.game
    with pytest.raises(ValueError, match="settings \\['lam'\\] were given with a ready game"):
        cory_env.single_seat(aec, lam=0)


# ---------------------------------------------------------------- 2b. SB3 in the observer seat


def test_sb3_ppo_observer_beats_random_beyond_chance() -> None:
    """SB3's PPO learns the observer seat in ~16k steps (~15 s on 2 cores).

    The claim is checked against chance with Hoeffding's inequality. After training, the
    policy is fixed and the N evaluation games are independent, so the observer's N
    answer-check scores are i.i.d. in [0, 1] with some mean mu. The uniformly random policy's
    expected score mu_0 is computed exactly (every 21**2 token sequence of every query,
    scored by the answer checker): about 0.05. If PPO were no better than random (mu <=
    mu_0), then P(mean >= mu_0 + t) <= exp(-2 N t^2); with N = 400 and t = 0.131 that is
    1e-6. So a mean above mu_0 + t cannot come from a random-level policy by chance. The
    scripted pioneer is right 80% of the time; PPO reached 0.79-0.82 with seeds 0-3.
    """
    sb3 = load_example("sb3_observer")
    n = 400
    model = sb3.train(total_timesteps=16_000, seed=0, p_correct=0.8)
    learned = sb3.play(sb3.sb3_policy(model), n, p_correct=0.8)
    random_play = sb3.play(sb3.random_policy(0), n, p_correct=0.8)
    mu_0 = sb3.random_expected_score()
    t = sb3.hoeffding_margin(n, delta=1e-6)
    assert 0.02 < mu_0 < 0.08 and math.isclose(t, 0.1314, abs_tol=1e-3)
    # The exact expectation agrees with random play (two-sided Hoeffding, delta 1e-6).
    assert abs(random_play["observer"].mean() - mu_0) <= sb3.hoeffding_margin(n, 0.5e-6)
    assert learned["observer"].mean() >= mu_0 + t, learned["observer"].mean()
    # What it learned is real: right answers follow the reference it sees.
    assert learned["copied"].mean() > 0.3


# ---------------------------------------------------------------- 3. TorchRL trains both seats


@pytest.mark.filterwarnings("ignore:PettingZoo in TorchRL is tested")
@pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater:DeprecationWarning")  # at import
def test_torchrl_trains_both_seats_beyond_chance(tok) -> None:
    """TorchRL (PettingZooWrapper on the AEC env, Collector, GAE, ClipPPOLoss per seat)
    trains both seats of the EASY small-vocab game: roles exchange every game, both are paid
    r_pio + r_obs.

    Learning is checked, not just updating. TorchRL's wrapper costs a few ms per token, so
    the full small game (2-token answers) needs ~30000 frames (~150 s; both seats then reach
    ~0.55), too long for a test; the EASY variant (one-token answers 0..4) learns in 2400
    frames. A uniformly random token is
    right with probability exactly 1/21 (checked below by decoding every token). After
    training, each seat's N = 300 evaluation scores (played through TorchRL's rollout) are
    i.i.d. {0, 1}; if a seat were no better than random (mean <= 1/21), the Chernoff-Hoeffding
    bound P(mean >= q) <= exp(-N KL(q || 1/21)) puts q = 0.125 at probability 1e-6. Seats
    reached 0.27-0.51 with seeds 0-2.
    """
    marl = load_example("marl_both_seats")
    for digit in "01234":
        right = [t for t in range(len(tok)) if tok.decode([t], skip_special_tokens=True) == digit]
        assert len(right) == 1  # exactly one of the 21 tokens answers right
    n = 300
    out = marl.train(2400, seed=0, **marl.EASY)
    for g in marl.AGENTS:
        now = list(out["policies"][g].parameters())
        assert any(not (a == b).all() for a, b in zip(out["initial"][g], now, strict=True)), g
        assert out["log"]["updates"][g] >= 8
        assert len(out["log"][g]) == 4 and not np.isnan(out["log"][g]).any()  # games ended
    scores = marl.evaluate(out["policies"], n, **marl.EASY)
    bar = marl.chance_threshold(1 / 21, n, delta=1e-6)
    assert 0.10 < bar < 0.14
    for g in marl.AGENTS:
        assert len(scores[g]) == n
        assert scores[g].mean() >= bar, (g, scores[g].mean())
