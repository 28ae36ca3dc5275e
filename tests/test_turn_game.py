"""The turn-level face (cory_env.turn_game): one whole answer per step, the same rules as the
token-level game; PettingZoo's api and seed tests; the same answers give the same game."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

import cory_env
from cory_env import custom_task, text_game
from cory_env.turn_game import play_answers, turn_game

WORDS = "good great fun bad the movie love boring very not".split()


def word_count(queries, responses):
    return [len(r.split()) for r in responses]


def chain_prompt(role, query, earlier):
    """The query, then every answer shown (oldest first): words of the tiny vocabulary."""
    return " ".join([query.text, *earlier])


def words_task():
    queries = ["the movie", "a film was", "this story"]
    return custom_task(queries, word_count, name="words", prompt_fn=chain_prompt)


@pytest.fixture(scope="module")
def real_tok():
    return cory_env.load_tokenizer("embedded")


@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
@pytest.mark.filterwarnings("ignore:Action space for each agent probably")  # text, by design
@pytest.mark.parametrize(
    "task, settings",
    [
        ("imdb", {"n_agents": 2}),
        ("arith", {"n_agents": 3, "sees": "all"}),
        ("imdb", {"n_agents": 2, "rounds": 2, "pay_every_round": True}),
        ("imdb", {"n_agents": 1}),
    ],
)
def test_pettingzoo_api_and_seed(task, settings, real_tok) -> None:
    def make():
        return turn_game(task, max_new_tokens=3, tokenizer=real_tok, **settings)

    api_test(make(), num_cycles=10)
    seed_test(make, num_cycles=10)


def play_token_face(env, answers, tokenizer, seed, episode):
    """Play ``answers`` (one per turn, in order) token by token: each answer's tokens, then EOS.
    Returns the prompt text of each turn decoded from the observation and the final last()."""
    env.reset(seed=seed, options={"episode": episode})
    eos, contexts, final, turn, sent = tokenizer.eos_token_id, [], {}, 0, 0
    for agent in env.agent_iter():
        obs, reward, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = (reward, info)
            env.step(None)
            continue
        tokens = tokenizer(answers[turn], add_special_tokens=False)["input_ids"] + [eos]
        if sent == 0:
            mask = obs["attention_mask"]
            contexts.append([int(t) for t, m in zip(obs["input_ids"], mask, strict=True) if m])
        env.step(tokens[sent])
        sent += 1
        if len(env.game.turns) > turn:  # the turn ended (EOS or the budget)
            turn, sent = turn + 1, 0
    return contexts, final


def play_turn_face(env, answers, seed, episode):
    env.reset(seed=seed, options={"episode": episode})
    prompts, final, turn = [], {}, 0
    for agent in env.agent_iter():
        obs, reward, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = (reward, info)
            env.step(None)
            continue
        assert obs["role"] == turn % env.game.n_agents
        prompts.append(obs["prompt"])
        env.step(answers[turn])
        turn += 1
    return prompts, final


@pytest.mark.parametrize(
    "settings",
    [
        {"n_agents": 2, "lam": 1.0},
        {"n_agents": 3, "lam": 0.5, "sees": "all"},
        {"n_agents": 2, "lam": -1.0, "sees": "none"},
        {"n_agents": 2, "lam": 0.0, "rounds": 3, "pay_every_round": True},
        {"n_agents": 3, "lam": 1.0, "rounds": 2},
    ],
)
def test_same_answers_same_game_as_token_level(settings, tiny_tokenizer) -> None:
    """Random answers (some longer than the budget) through both faces, over enough episodes
    for every role exchange: every reward, score, role, response, state and prompt agree."""
    rng = np.random.default_rng(0)
    common = {"max_new_tokens": (2, 6), "role_exchange_period": 1, "tokenizer": tiny_tokenizer}
    token_env = text_game(words_task(), **common, **settings)
    turn_env = turn_game(words_task(), **common, **settings)
    n_turns = token_env.game.n_turns
    for episode in range(2 * settings["n_agents"]):
        answers = [" ".join(rng.choice(WORDS, size=rng.integers(0, 8))) for _ in range(n_turns)]
        contexts, token_final = play_token_face(token_env, answers, tiny_tokenizer, 7, episode)
        prompts, turn_final = play_turn_face(turn_env, answers, 7, episode)
        assert [tiny_tokenizer(p)["input_ids"] for p in prompts] == contexts
        assert turn_final == token_final  # rewards and infos: roles, scores, responses, per turn
        tg, kg = turn_env.game, token_env.game
        assert tg.roles == kg.roles and tg.episode == kg.episode == episode
        for a in tg.possible_agents:
            np.testing.assert_array_equal(tg.rewards[a], kg.rewards[a])
            np.testing.assert_array_equal(tg.turn_rewards[a], kg.turn_rewards[a])
        np.testing.assert_array_equal(turn_env.state(), token_env.state())
        assert turn_env.state_text() == token_env.state_text()


def test_answer_is_cut_at_the_budget_and_paid(tiny_tokenizer) -> None:
    env = turn_game(words_task(), max_new_tokens=2, lam=1.0, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    assert env.observe("llm_0")["prompt"] == env.game.queries[0].text  # the pioneer's prompt
    assert env.observe("llm_1")["prompt"] == ""  # not its turn yet
    env.step("good fun movie")
    assert env.infos["llm_0"]["responses"]["llm_0"] == "good fun"
    assert "good fun" in env.observe("llm_1")["prompt"]
    env.step("bad")
    assert env.rewards == {"llm_0": 3.0, "llm_1": 3.0}
    assert all(env.terminations.values())


def test_bad_actions_are_refused_clearly(tiny_tokenizer) -> None:
    env = turn_game(words_task(), tokenizer=tiny_tokenizer)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("good")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="text"):
        env.step(5)
    with pytest.raises(KeyError, match="unknown agent"):
        env.observation_space("llm_9")
    with pytest.raises(ValueError, match="turn of 'llm_0'"):
        play_answers(env.game, ["good"], agent="llm_1")
    with pytest.raises(ValueError, match="1 texts"):
        play_answers(env.game, ["good", "bad"])
    env.step("good")
    env.step("fun")
    with pytest.raises(ValueError, match="only valid action is None"):
        env.step("more")


def test_batched_rows_take_their_own_answers(tiny_tokenizer) -> None:
    game = cory_env.batched_game(
        words_task(), batch_size=3, max_new_tokens=4, lam=0.0, tokenizer=tiny_tokenizer
    )
    game.reset(seed=0)
    play_answers(game, ["good", "", "very very very very very"])
    play_answers(game, ["fun", "the movie", "bad"])
    assert game.done
    np.testing.assert_array_equal(game.rewards["llm_0"], [1, 0, 4])
    np.testing.assert_array_equal(game.rewards["llm_1"], [1, 2, 1])
    assert game.responses["llm_1"] == ["fun", "the movie", "bad"]


def test_the_docs_game_played_token_by_token_and_answer_by_answer(capsys) -> None:
    """docs/turn_level.md's first two ways run and pay both seats 2.0 each."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "turn_level.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)[:2]
    namespace: dict = {}
    for block in blocks:
        exec(block, namespace)
    printed = capsys.readouterr().out.splitlines()
    paid = [line for line in printed if line.startswith("llm_") and line.endswith(" 2.0")]
    assert sorted(paid) == sorted(["llm_0 pioneer 2.0", "llm_1 observer 2.0"] * 2), printed
