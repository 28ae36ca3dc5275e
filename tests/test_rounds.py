"""Games of several rounds on the same env: PettingZoo's API, seed and state checks for every
task, agent count and round count; what each answer sees; who is paid what, per turn; the
global state; and a one-round game unchanged."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test
from pettingzoo.test.state_test import test_state as state_test
from pettingzoo.test.state_test import test_state_space as state_space_test

import cory_env
from cory_env import batched_game, custom_task, text_game
from cory_env.checks import SettingError

TASKS_CONTEXT = {"imdb": 160, "gsm8k": 1024, "arith": 256}
"""Context per real task: room for a later round's prompt, which shows several answers."""
BUDGET = 3


@pytest.fixture(scope="module")
def real_tok():
    return cory_env.load_tokenizer("embedded")


def echo_prompt(role, query, earlier):
    """The query, then every answer the role sees, each in brackets (to read them back)."""
    return query.text + "".join(f" [{a}]" for a in earlier)


def word_count(queries, responses):
    return [float(len(r.split())) for r in responses]


def words_task():
    return custom_task(["the movie", "a film was"], word_count, echo_prompt, name="words")


def play(game, token_of):
    """Play one batch; ``token_of(turn_index) -> token id`` for every row."""
    while not game.done:
        agent = game.agent_selection
        game.step(np.full(game.batch_size, token_of(len(game.turns))), agent=agent)


@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize("n_agents", [1, 2, 3])
@pytest.mark.parametrize("task", ["imdb", "gsm8k", "arith"])
def test_pettingzoo_api_seed_and_state_for_every_task_agents_and_rounds(
    task, n_agents, rounds, real_tok
):
    def make():
        return text_game(
            task,
            n_agents=n_agents,
            rounds=rounds,
            max_new_tokens=BUDGET,
            context_length=TASKS_CONTEXT[task],
            tokenizer=real_tok,
        )

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not fit context_length")
        api_test(make(), num_cycles=30)
        seed_test(make, num_cycles=30)
        env = make()
        state_space_test(env)
        state_test(env, num_cycles=30)


def test_a_pay_every_round_game_passes_the_api_test(real_tok):
    env = text_game(
        "arith",
        n_agents=2,
        rounds=3,
        pay_every_round=True,
        max_new_tokens=BUDGET,
        context_length=256,
        tokenizer=real_tok,
    )
    api_test(env, num_cycles=30)


def test_later_rounds_see_the_others_latest_answers_and_their_own(tiny_tokenizer):
    """Two agents, three rounds, ``sees: previous``: the pioneer revises after reading the
    observer; each later prompt shows the answer just before it and its own last one."""
    game = batched_game(
        words_task(),
        batch_size=1,
        n_agents=2,
        rounds=3,
        max_new_tokens=2,
        context_length=64,
        tokenizer=tiny_tokenizer,
        role_exchange_period=100,
    )
    words = ["great", "good", "bad", "fun", "boring", "plot"]
    vocab = tiny_tokenizer.get_vocab()
    game.reset(seed=0)
    prompts = []
    while not game.done:
        agent = game.agent_selection
        obs = game.observe(agent)
        if obs["num_generated"][0] == 0:
            ids = obs["input_ids"][0][obs["attention_mask"][0] == 1]
            prompts.append((agent, tiny_tokenizer.decode(ids)))
        game.step(np.array([vocab[words[len(game.turns)]]]), agent=agent)
    query = game.queries[0].text

    def shown(*answers):  # the echo prompt's brackets are unknown to the tiny tokenizer
        return query + "".join(f" <unk> {a} {a} <unk>" for a in answers)

    assert prompts == [
        ("llm_0", shown()),  # round 1: the query
        ("llm_1", shown("great")),  # the pioneer's answer
        ("llm_0", shown("great", "good")),  # round 2: its own, then the observer's
        ("llm_1", shown("good", "bad")),  # its own, then the pioneer's revision
        ("llm_0", shown("bad", "fun")),
        ("llm_1", shown("fun", "boring")),
    ]
    assert [t.round for t in game.turns] == [0, 0, 1, 1, 2, 2]
    assert game.responses["llm_0"] == ["boring boring"] and game.responses["llm_1"] == ["plot plot"]


@pytest.mark.parametrize("pay_every_round", [False, True])
def test_rewards_per_turn_paid_every_round_or_only_the_last(tiny_tokenizer, pay_every_round):
    """Words counted: every answer of round k has k + 1 words. Paid every round, agent i
    gets r_self + lam * r_other per round; else only the last round pays."""
    game = batched_game(
        words_task(),
        batch_size=2,
        n_agents=2,
        rounds=3,
        lam=0.5,
        pay_every_round=pay_every_round,
        max_new_tokens=3,
        context_length=64,
        tokenizer=tiny_tokenizer,
    )
    game.reset(seed=0)
    eos, word = tiny_tokenizer.eos_token_id, tiny_tokenizer.convert_tokens_to_ids("fun")
    while not game.done:
        agent = game.agent_selection
        k = game.round
        n = int(game.observe(agent)["num_generated"][0])
        game.step(np.full(2, word if n <= k else eos), agent=agent)
    per_round = [(k + 1) * 1.5 for k in range(3)]  # both answer k + 1 words; lam 0.5
    expected = per_round if pay_every_round else [0.0, 0.0, per_round[-1]]
    for agent in game.possible_agents:
        paid = [float(r[0]) for r in game.turn_rewards[agent]]
        assert paid == expected
        assert game.rewards[agent].tolist() == [sum(expected)] * 2
        assert game.scores[agent].tolist() == [3.0, 3.0]  # the last round's raw scores


def test_the_aec_env_pays_each_round_through_last_and_infos(tiny_tokenizer):
    env = text_game(
        words_task(),
        n_agents=2,
        rounds=2,
        lam=1.0,
        pay_every_round=True,
        max_new_tokens=2,
        context_length=64,
        tokenizer=tiny_tokenizer,
    )
    env.reset(seed=0)
    word = tiny_tokenizer.convert_tokens_to_ids("fun")
    totals = {a: 0.0 for a in env.possible_agents}
    for agent in env.agent_iter():
        _, reward, term, trunc, info = env.last()
        totals[agent] += reward
        env.step(None if term or trunc else word)
    # each round: both answer 2 words, each paid 2 + 2 = 4; two rounds
    assert totals == {"llm_0": 8.0, "llm_1": 8.0}
    assert info["turn_rewards"] == {"llm_0": [4.0, 4.0], "llm_1": [4.0, 4.0]}
    assert info["round"] == 1


def test_the_global_state_holds_the_query_and_every_answer(tiny_tokenizer):
    game = batched_game(
        words_task(),
        batch_size=2,
        n_agents=2,
        rounds=2,
        max_new_tokens=2,
        context_length=32,
        tokenizer=tiny_tokenizer,
    )
    game.reset(seed=1)
    space = game.state_space()
    state = game.state()
    assert state.shape == (2, 5, 32) and (state[:, 1:] == -1).all()
    word = tiny_tokenizer.convert_tokens_to_ids("fun")
    play(game, lambda turn: word)
    state = game.state()
    assert all(space.contains(row) for row in state)
    query_ids = tiny_tokenizer(game.queries[0].text)["input_ids"]
    assert state[0, 0, : len(query_ids)].tolist() == query_ids
    assert (state[:, 1:, :2] == word).all() and (state[:, 1:, 2:] == -1).all()
    text = game.state_text()[0]
    assert text["query"] == game.queries[0].text
    assert [(t["round"], t["agent"], t["text"]) for t in text["turns"]] == [
        (0, "llm_0", "fun fun"),
        (0, "llm_1", "fun fun"),
        (1, "llm_0", "fun fun"),
        (1, "llm_1", "fun fun"),
    ]


def test_with_one_round_paying_every_round_changes_nothing(tiny_tokenizer):
    """rounds 1: pay_every_round plays, observes and pays as the default does (that
    rounds 1 is the game as it was, seed by seed, is tests/test_same_metrics.py's)."""

    def run(**extra):
        game = batched_game(
            words_task(),
            batch_size=3,
            n_agents=3,
            lam=0.5,
            max_new_tokens=3,
            context_length=64,
            tokenizer=tiny_tokenizer,
            **extra,
        )
        game.reset(seed=3)
        seen = []
        while not game.done:
            agent = game.agent_selection
            seen.append(game.observe(agent)["input_ids"].copy())
            game.step(np.full(3, 7), agent=agent)
        return seen, game.rewards, game.scores

    seen, rewards, scores = run()
    seen1, rewards1, scores1 = run(rounds=1, pay_every_round=True)
    assert all((a == b).all() for a, b in zip(seen, seen1, strict=True))
    assert {a: r.tolist() for a, r in rewards.items()} == {
        a: r.tolist() for a, r in rewards1.items()
    }
    assert {a: r.tolist() for a, r in scores.items()} == {a: r.tolist() for a, r in scores1.items()}


def test_bad_round_settings_are_refused(tiny_tokenizer):
    for rounds, match in ((0, "rounds"), (1000, "rounds"), (1.5, "rounds")):
        with pytest.raises(SettingError, match=match):
            batched_game(words_task(), rounds=rounds, tokenizer=tiny_tokenizer)
    with pytest.raises(SettingError, match="pay_every_round"):
        batched_game(words_task(), rounds=2, pay_every_round="yes", tokenizer=tiny_tokenizer)


def test_a_later_round_whose_prompt_hides_the_answers_is_refused(tiny_tokenizer):
    blind = custom_task(["the movie"], word_count, lambda role, query, earlier: query.text)
    with pytest.raises(SettingError, match="does not show the earlier answers"):
        batched_game(blind, rounds=2, tokenizer=tiny_tokenizer)
    batched_game(blind, rounds=1, tokenizer=tiny_tokenizer)  # one round shows nothing later
