"""Every game variant (issue 6): who sees whom (``sees``), groups of rows per query
(``group_size``), normalised rewards (``reward_norm``), role exchange turned off by a huge
period, and heterogeneous seats with two different tokenizers. Each is tested by what the
agents SEE (their observations) and what they are PAID (their rewards)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import cory_env
from cory_env import GAME_SETTINGS, BatchedTextGame, batched_game, custom_task, text_game
from cory_env.core import standardise
from cory_env.tasks.arith import EXAMPLE
from cory_env.tasks.imdb import OBSERVER_TEMPLATE

from .conftest import WORDS, make_tiny_tokenizer

QUERIES = ("the movie", "a film was", "this story", "the plot is", "one good film")


@pytest.fixture(scope="module")
def real_tok():
    return cory_env.load_tokenizer("embedded")


def word_count(queries, responses):
    """Known reward: the number of whitespace words of the response."""
    return [len(r.split()) for r in responses]


def context(obs, row: int = 0) -> list[int]:
    """The unpadded token ids of one row of a batched observation."""
    ids, mask = obs["input_ids"][row], obs["attention_mask"][row]
    return [int(t) for t, m in zip(ids, mask, strict=True) if m]


def play(game, counts, word="good", seen=None):
    """Play one batched episode: agent a answers ``counts[a][row]`` times ``word``, then EOS.

    ``seen[agent]`` records each row's observation context at the start of its turn.
    """
    tok = game.tokenizers[0]
    token, eos = tok.convert_tokens_to_ids(word), tok.eos_token_id
    while not game.done:
        agent = game.agent_selection
        obs = game.observe(agent)
        if seen is not None and not obs["num_generated"].any():
            seen[agent] = [context(obs, b) for b in range(game.batch_size)]
        want = np.asarray(counts[agent])
        game.step(np.where(obs["num_generated"] < want, token, eos), agent=agent)


# ---------------------------------------------------------------- settings


def test_new_settings_are_game_settings_with_defaults(tiny_tokenizer) -> None:
    for name in ("sees", "group_size", "reward_norm"):
        assert name in GAME_SETTINGS  # train/ builds games from these names
    game = batched_game(custom_task(QUERIES, word_count), batch_size=2, tokenizer=tiny_tokenizer)
    assert (game.settings.sees, game.settings.group_size, game.settings.reward_norm) == (
        "previous",
        1,
        False,
    )
    assert game.group_size == 1
    game = batched_game(
        custom_task(QUERIES, word_count), batch_size=4, group_size=2.0, tokenizer=tiny_tokenizer
    )
    assert game.group_size == 2 and type(game.group_size) is int  # stored canonically


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"sees": "chain"},
            r"game: sees must be one of \['previous', 'all', 'none'\], got 'chain'",
        ),
        ({"sees": None}, r"game: sees must be one of .*got None"),
        ({"sees": True}, r"game: sees must be one of .*got True"),
        ({"group_size": 0}, r"game: group_size must be an integer >= 1, got 0"),
        ({"group_size": True}, r"game: group_size must be an integer >= 1, got True"),
        ({"group_size": 1.5}, r"game: group_size must be an integer >= 1, got 1.5"),
        ({"reward_norm": 1}, r"game: reward_norm must be true or false, got 1"),
        ({"reward_norm": "yes"}, r"game: reward_norm must be true or false, got 'yes'"),
        (
            {"batch_size": 6, "group_size": 4},
            r"game: batch_size must be a multiple of group_size \(4\), got 6",
        ),
    ],
)
def test_new_settings_refused(tiny_tokenizer, settings, message) -> None:
    settings = {"batch_size": 4, **settings}
    with pytest.raises(ValueError, match=message):
        batched_game(custom_task(QUERIES, word_count), tokenizer=tiny_tokenizer, **settings)


def test_the_aec_env_refuses_settings_that_need_a_batch(tiny_tokenizer) -> None:
    task = custom_task(QUERIES, word_count)
    with pytest.raises(
        ValueError, match=r"one game at a time \(B=1\), so group_size must be 1, got 2"
    ):
        text_game(task, group_size=2, tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"reward_norm standardises scores over a batch"):
        text_game(task, reward_norm=True, tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"reward_norm"):
        cory_env.TextGameEnv(BatchedTextGame(task, reward_norm=True, tokenizer=tiny_tokenizer))
    with pytest.raises(ValueError, match=r"group_size must be an integer >= 1, got 0"):
        text_game(task, group_size=0, tokenizer=tiny_tokenizer)
    env = text_game(task, group_size=1, reward_norm=False, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    assert env.game.group_size == 1


# ---------------------------------------------------------------- sees


def recording_prompt(calls):
    def prompt(role, query, earlier):
        calls.append((role, query.text, list(earlier)))
        return " and ".join([query.text, *[a.strip() for a in earlier]])

    return prompt


@pytest.mark.parametrize(
    ("sees", "seen_roles"),
    [
        ("previous", [[], [0], [1], [2]]),
        ("all", [[], [0], [0, 1], [0, 1, 2]]),
        ("none", [[], [], [], []]),
    ],
)
def test_who_sees_whom(tiny_tokenizer, sees, seen_roles) -> None:
    """Four agents, two rows: each prompt holds exactly the answers ``sees`` allows."""
    calls = []
    task = custom_task(QUERIES, word_count, prompt_fn=recording_prompt(calls))
    game = batched_game(
        task, batch_size=2, n_agents=4, sees=sees, max_new_tokens=4, tokenizer=tiny_tokenizer
    )
    game.reset(seed=1)
    words = {"llm_0": "great", "llm_1": "bad", "llm_2": "fun", "llm_3": "love"}
    counts = {"llm_0": [1, 2], "llm_1": [2, 1], "llm_2": [1, 1], "llm_3": [3, 2]}
    seen = {}
    tok = tiny_tokenizer
    while not game.done:  # each agent its own word
        agent = game.agent_selection
        obs = game.observe(agent)
        if not obs["num_generated"].any():
            seen[agent] = [context(obs, b) for b in range(2)]
        token = tok.convert_tokens_to_ids(words[agent])
        game.step(np.where(obs["num_generated"] < counts[agent], token, tok.eos_token_id))
    answers = {a: [" ".join([words[a]] * n) for n in counts[a]] for a in words}
    assert game.info("llm_0")["responses"] == answers
    queries = [q.text for q in game.queries]
    order = game.agents_by_role
    assert order == ["llm_0", "llm_1", "llm_2", "llm_3"]
    prompt_role = (lambda r: 0) if sees == "none" else (lambda r: r)
    expected_calls = []
    for role, agent in enumerate(order):
        assert [game.seen_roles(role)] == [seen_roles[role]]
        for b, q in enumerate(queries):
            earlier = [answers[order[r]][b] for r in seen_roles[role]]
            expected_calls.append((prompt_role(role), q, earlier))
            text = " and ".join([q, *earlier])
            assert seen[agent][b] == tok(text)["input_ids"], (agent, b)  # what it SEES
        assert int(game.observe(agent)["role"][0]) == role  # its role is still its role
    assert calls == expected_calls
    # What they are PAID does not depend on whom they saw: r_self + lam * sum(r_others).
    scores = {a: np.asarray(counts[a], dtype=float) for a in words}
    total = sum(scores.values())
    for a in words:
        np.testing.assert_allclose(game.scores[a], scores[a])
        np.testing.assert_allclose(game.rewards[a], scores[a] + 1.0 * (total - scores[a]))


def test_sees_none_is_the_no_transfer_ablation(real_tok) -> None:
    """imdb, sees="none": every agent's observation is the pioneer's prompt (the query);
    every agent is still paid the collective reward with lam."""
    game = batched_game(
        "imdb",
        batch_size=3,
        n_agents=3,
        sees="none",
        lam=0.5,
        max_new_tokens=3,
        role_exchange_period=1,
        tokenizer=real_tok,
    )
    for seed in (0, None):
        game.reset(seed=seed)
        seen = {}
        play(game, {a: [3, 1, 2] for a in game.possible_agents}, word="Ġgreat", seen=seen)
        assert game.agents_by_role[0] == f"llm_{game.episode % 3}"
        for agent in game.possible_agents:
            for b, q in enumerate(game.queries):
                assert seen[agent][b] == real_tok(q.text)["input_ids"]
        raw = game.scores
        for a in game.possible_agents:
            others = sum(raw[o] for o in game.possible_agents if o != a)
            np.testing.assert_allclose(game.rewards[a], raw[a] + 0.5 * others)
        assert any(raw["llm_0"] != 0)


@pytest.mark.parametrize("task", ["imdb", "gsm8k", "arith"])
def test_sees_all_with_the_task_templates(real_tok, task) -> None:
    """Three agents: the last one's prompt renders both earlier answers with the task's
    template for several answers; with sees="previous" it is the one-answer template."""
    answers = {"llm_0": " 12 is it", "llm_1": " 13 is it"}
    n_tokens = {
        a: len(real_tok(t, add_special_tokens=False)["input_ids"]) for a, t in answers.items()
    }
    budget = max(n_tokens.values()) + 1

    def observed(sees):
        game = batched_game(
            task, batch_size=1, n_agents=3, sees=sees, max_new_tokens=budget, tokenizer=real_tok
        )
        game.reset(seed=2)
        while game.agent_selection != "llm_2":
            agent = game.agent_selection
            ids = real_tok(answers[agent], add_special_tokens=False)["input_ids"]
            n = int(game.observe(agent)["num_generated"][0])
            game.step([ids[n] if n < len(ids) else real_tok.eos_token_id], agent=agent)
        assert game.info("llm_2")["responses"] == {a: [t] for a, t in answers.items()}
        text = real_tok.decode(context(game.observe("llm_2")), skip_special_tokens=True)
        return game.queries[0].text, text

    q, text = observed("all")
    _, chain = observed("previous")
    if task == "imdb":
        assert (
            text == f'I can make these sentences "{q} 12 is it", "{q} 13 is it" more positive: {q}'
        )
        assert chain == OBSERVER_TEMPLATE.format(sentence=q + " 13 is it", query=q)
    elif task == "gsm8k":
        assert text.endswith(f"Question: {q}\nReference: 12 is it\nReference: 13 is it\nAnswer:")
        assert chain.endswith(f"Question: {q}\nReference: 13 is it\nAnswer:")
    else:
        refs = "Reference answer: 12 is it\nReference answer: 13 is it\n"
        assert text == f"{EXAMPLE}Q: {q}\n{refs}A:"
        assert chain == f"{EXAMPLE}Q: {q}\nReference answer: 13 is it\nA:"


# ---------------------------------------------------------------- group_size


def test_groups_share_a_query_and_draws_are_as_documented(tiny_tokenizer) -> None:
    queries = [f"the movie {w}" for w in WORDS[2:30]]
    task = custom_task(queries, word_count)
    game = batched_game(
        task, batch_size=6, group_size=3, max_new_tokens=(2, 9), tokenizer=tiny_tokenizer
    )
    assert game.group_size == 3
    rng = np.random.default_rng(5)  # what gymnasium's seeding.np_random(5) builds
    game.reset(seed=5)
    group_texts = []
    for episode in range(12):
        if episode:
            game.reset()
        picks = rng.integers(0, len(queries), size=2)  # one query per group
        budget = int(rng.integers(2, 9))  # then one budget for the batch
        texts = [q.text for q in game.queries]
        assert texts == [queries[i] for i in picks for _ in range(3)]
        assert game.budget == budget
        assert texts[0] == texts[1] == texts[2] and texts[3] == texts[4] == texts[5]
        group_texts += [texts[0], texts[3]]
        counts = {"llm_0": [0, 1, 2, 2, 1, 0], "llm_1": [1, 1, 1, 0, 0, 0]}
        play(game, {a: np.minimum(c, budget) for a, c in counts.items()})
        # Rows of a group answer (and are scored) on their own.
        np.testing.assert_allclose(game.scores["llm_0"], np.minimum(counts["llm_0"], budget))
    # Groups are drawn independently: they differ from episode to episode and within one.
    assert len(set(group_texts)) > 12
    assert any(group_texts[2 * e] != group_texts[2 * e + 1] for e in range(12))


def test_group_size_one_draws_as_before_and_whole_batch_groups(tiny_tokenizer) -> None:
    queries = [f"the movie {w}" for w in WORDS[2:30]]
    task = custom_task(queries, word_count)
    single = batched_game(task, batch_size=4, max_new_tokens=(2, 9), tokenizer=tiny_tokenizer)
    single.reset(seed=9)
    rng = np.random.default_rng(9)
    assert [q.text for q in single.queries] == [queries[i] for i in rng.integers(0, 28, size=4)]
    assert single.budget == int(rng.integers(2, 9))
    whole = batched_game(task, batch_size=4, group_size=4, tokenizer=tiny_tokenizer)
    for seed in range(5):
        whole.reset(seed=seed)
        assert len({q.text for q in whole.queries}) == 1


def test_groups_resume_from_json_state(tiny_tokenizer) -> None:
    def make():
        task = custom_task([f"the movie {w}" for w in WORDS[2:20]], word_count)
        return batched_game(task, batch_size=4, group_size=2, tokenizer=tiny_tokenizer)

    game = make()
    game.reset(seed=3)
    state = json.loads(json.dumps(game.state_dict()))
    game.reset()
    fresh = make()
    fresh.load_state_dict(state)
    fresh.reset()
    assert fresh.queries == game.queries and fresh.budget == game.budget


# ---------------------------------------------------------------- reward_norm


def test_standardise() -> None:
    np.testing.assert_allclose(standardise([0.0, 0.0, 2.0, 2.0]), [-1, -1, 1, 1])
    np.testing.assert_allclose(standardise([0, 1, 2, 3]), np.array([-3, -1, 1, 3]) / math.sqrt(5))
    assert standardise([5.0, 5.0, 5.0]).tolist() == [0.0, 0.0, 0.0]  # std 0: just centred
    assert standardise([0.1, 0.1, 0.1]).tolist() == [0.0, 0.0, 0.0]  # not +-1 from rounding
    assert standardise([7.0]).tolist() == [0.0]


@pytest.mark.parametrize("lam", [1.0, 0.0, -0.5, -1.0])
def test_reward_norm_hand_computed(tiny_tokenizer, lam) -> None:
    """Three agents, four rows. Word counts (the raw scores) and their standard scores:
    llm_0 [0,0,2,2] -> [-1,-1,1,1]; llm_1 [1,1,1,1] -> [0,0,0,0] (std 0: centred);
    llm_2 [3,1,1,3] -> [1,-1,-1,1]. Paid: z_self + lam * sum(z_others)."""
    counts = {"llm_0": [0, 0, 2, 2], "llm_1": [1, 1, 1, 1], "llm_2": [3, 1, 1, 3]}
    expected = {
        "llm_0": [-1 + lam, -1 - lam, 1 - lam, 1 + lam],
        "llm_1": [0.0, -2 * lam, 0.0, 2 * lam],
        "llm_2": [1 - lam, -1 - lam, -1 + lam, 1 + lam],
    }
    for norm in (True, False):
        game = batched_game(
            custom_task(QUERIES, word_count),
            batch_size=4,
            n_agents=3,
            lam=lam,
            reward_norm=norm,
            max_new_tokens=4,
            tokenizer=tiny_tokenizer,
        )
        game.reset(seed=0)
        play(game, counts)
        for a, c in counts.items():
            np.testing.assert_allclose(game.scores[a], c)  # raw task scores, always
            assert game.info(a)["scores"][a].tolist() == c
        if norm:
            for a in counts:
                np.testing.assert_allclose(game.rewards[a], expected[a], atol=1e-12)
        else:
            total = np.sum([counts[a] for a in counts], axis=0)
            for a, c in counts.items():
                np.testing.assert_allclose(game.rewards[a], np.array(c) + lam * (total - c))


def test_reward_norm_unit_std_two_agents(tiny_tokenizer) -> None:
    """llm_0 [0,1,2,3]: mean 1.5, std sqrt(1.25) -> [-3,-1,1,3]/sqrt(5); llm_1 [2,2,0,0] ->
    [1,1,-1,-1]. With lam=-0.5: llm_0 gets z0 - 0.5*z1, llm_1 gets z1 - 0.5*z0."""
    game = batched_game(
        custom_task(QUERIES, word_count),
        batch_size=4,
        lam=-0.5,
        reward_norm=True,
        max_new_tokens=4,
        tokenizer=tiny_tokenizer,
    )
    game.reset(seed=0)
    play(game, {"llm_0": [0, 1, 2, 3], "llm_1": [2, 2, 0, 0]})
    z0 = np.array([-3, -1, 1, 3]) / math.sqrt(5)
    z1 = np.array([1, 1, -1, -1])
    np.testing.assert_allclose(game.rewards["llm_0"], z0 - 0.5 * z1)
    np.testing.assert_allclose(game.rewards["llm_1"], z1 - 0.5 * z0)
    np.testing.assert_allclose(game.scores["llm_0"], [0, 1, 2, 3])
    assert game.rewards["llm_0"].mean() == pytest.approx(0.0, abs=1e-12)


def test_reward_norm_of_equal_float_scores_is_zero(tiny_tokenizer) -> None:
    task = custom_task(QUERIES, lambda q, r: [0.1] * len(r))
    game = batched_game(
        task, batch_size=3, reward_norm=True, max_new_tokens=2, tokenizer=tiny_tokenizer
    )
    game.reset(seed=0)
    play(game, {"llm_0": [1, 2, 0], "llm_1": [2, 2, 2]})
    assert game.rewards["llm_0"].tolist() == game.rewards["llm_1"].tolist() == [0.0] * 3
    assert game.scores["llm_0"].tolist() == [0.1] * 3


# ---------------------------------------------------------------- role exchange off


@pytest.mark.parametrize("period", [10**9, 1e12, 2**70])
def test_huge_role_exchange_period_keeps_the_pioneer(tiny_tokenizer, period) -> None:
    task = custom_task(QUERIES, word_count)
    env = text_game(task, role_exchange_period=period, max_new_tokens=1, tokenizer=tiny_tokenizer)
    good = tiny_tokenizer.convert_tokens_to_ids("good")
    for episode in range(6):
        env.reset(seed=episode)
        assert env.agent_selection == "llm_0"
        assert env.infos["llm_0"]["role"] == "pioneer"
        paid = {}
        for agent in env.agent_iter():
            _, reward, term, _, _ = env.last()
            if term:
                paid[agent] = reward
            env.step(None if term else good)
        assert paid == {"llm_0": 2.0, "llm_1": 2.0}
    game = env.game
    assert type(game.settings.role_exchange_period) is int
    period = int(period)
    # Exchanges happen only after `period` episodes, with no overflow past int64.
    for episode, pioneer in [(period - 1, "llm_0"), (period, "llm_1"), (2 * period, "llm_0")]:
        env.reset(options={"episode": episode})
        assert env.agent_selection == pioneer
        assert env.observe(pioneer)["role"] == 0
        assert env.infos[pioneer]["episode"] == episode
    state = game.state_dict()
    assert state["next_episode"] == 2 * period + 1
    assert json.loads(json.dumps(state)) == state


# ---------------------------------------------------------------- heterogeneous seats


def make_other_tokenizer():
    """A second word-level tokenizer, built as the tiny one, with another vocabulary: the
    same words in reverse order (other ids), plus a few more (another size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<pad>", *reversed(WORDS[2:]), "excellent", "dull", "scene", "cast"]
    vocab = {w: i for i, w in enumerate(words)}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def test_two_different_tokenizers_each_seat_its_own() -> None:
    tok_a, tok_b = make_tiny_tokenizer(), make_other_tokenizer()
    assert len(tok_b) == len(tok_a) + 4
    assert tok_a("the movie")["input_ids"] != tok_b("the movie")["input_ids"]

    def prompt(role, query, earlier):
        return query.text if role == 0 else f"{query.text} but {earlier[-1]}"

    task = custom_task(["the movie was", "a film is"], word_count, prompt_fn=prompt)
    game = batched_game(
        task, batch_size=2, tokenizer=[tok_a, tok_b], max_new_tokens=3, role_exchange_period=1
    )
    for agent, tok in (("llm_0", tok_a), ("llm_1", tok_b)):
        assert game.action_space(agent).n == len(tok)
        assert game.observation_space(agent)["input_ids"].high.max() == len(tok) - 1
        assert game.tokenizers[game.possible_agents.index(agent)] is tok

    # Episode 0: llm_0 (tok_a) leads, llm_1 (tok_b) observes.
    game.reset(seed=0)
    texts = [q.text for q in game.queries]
    for b, text in enumerate(texts):
        assert context(game.observe("llm_0"), b) == tok_a(text)["input_ids"]
    great_a = tok_a.convert_tokens_to_ids("great")
    game.step([great_a, tok_a.eos_token_id], agent="llm_0")
    game.step([tok_a.eos_token_id] * 2, agent="llm_0")
    assert game.agent_selection == "llm_1"
    assert game.info("llm_1")["responses"]["llm_0"] == ["great", ""]
    for b, text in enumerate(texts):
        expected = f"{text} but {['great', ''][b]}"
        got = context(game.observe("llm_1"), b)
        assert got == tok_b(expected)["input_ids"] != tok_a(expected)["input_ids"]
        assert tok_b.unk_token_id not in got  # the text, re-tokenised by the observer's own
    # llm_1 may play a token that exists only in its own vocabulary.
    cast = tok_b.convert_tokens_to_ids("cast")
    assert cast >= len(tok_a)
    game.step([cast, tok_b.eos_token_id], agent="llm_1")
    with pytest.raises(ValueError, match=rf"action {len(tok_b)} for llm_1 at row 0"):
        game.step([len(tok_b), 0], agent="llm_1")
    game.step([tok_b.eos_token_id] * 2, agent="llm_1")
    assert game.info("llm_1")["responses"]["llm_1"] == ["cast", ""]
    np.testing.assert_allclose(game.rewards["llm_1"], [2.0, 0.0])

    # Episode 1: roles exchanged; llm_1 leads with the query in tok_b's ids and its own
    # vocabulary, and llm_0 reads llm_1's answer re-tokenised by tok_a.
    game.reset()
    assert game.agent_selection == "llm_1"
    for b, q in enumerate(game.queries):
        assert context(game.observe("llm_1"), b) == tok_b(q.text)["input_ids"]
    game.step([cast, tok_b.eos_token_id], agent="llm_1")
    game.step([tok_b.eos_token_id, 0], agent="llm_1")
    assert game.agent_selection == "llm_0"
    for b, q in enumerate(game.queries):
        expected = f"{q.text} but {['cast', ''][b]}"
        assert context(game.observe("llm_0"), b) == tok_a(expected)["input_ids"]
    assert tok_a.unk_token_id in context(game.observe("llm_0"), 0)  # "cast" is not tok_a's
    with pytest.raises(ValueError, match=rf"action {cast} for llm_0 at row 0 .*{len(tok_a)} tok"):
        game.step([cast, 0], agent="llm_0")
