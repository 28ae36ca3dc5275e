"""Clear errors, as classes: calls out of order, users' reward and prompt functions that
misbehave, settings and inputs of the wrong kind, the pad-token rule, the first-run notice."""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np
import pytest
import torch

import cory_env
from cory_env import TaskFunctionError, batched_game, custom_task, text_game
from cory_env.checks import RewardOutputError
from cory_env.models import embedded_model_dir, ensure_pad_token, pad_token_id
from cory_env.query import Query

QUERIES = ["the movie", "a film was"]


def word_count(queries, responses):
    return [len(r.split()) for r in responses]


def scored(reward_fn, n: int = 2) -> list[float]:
    """Score ``n`` responses with ``reward_fn`` through the task, as the game does."""
    task = custom_task(QUERIES[:n], reward_fn, name="mine")
    return task.score(task.queries, ["good fun", "bad"][:n])


# ---------------------------------------------------------------- calls out of order


def test_aec_calls_before_reset(tiny_tokenizer) -> None:
    env = text_game(custom_task(QUERIES, word_count), tokenizer=tiny_tokenizer)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step(3)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before last\(\)"):
        env.last()
    with pytest.raises(RuntimeError, match=r"call reset\(\) before observe\(\)"):
        env.observe("llm_0")
    with pytest.raises(RuntimeError, match=r"call reset\(\) before render\(\)"):
        env.render()
    assert list(env.agent_iter()) == []  # no agents before reset: nothing to iterate


def test_aec_step_and_last_after_the_game_is_over(tiny_tokenizer) -> None:
    env = text_game(custom_task(QUERIES, word_count), max_new_tokens=1, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    for agent in env.agent_iter():
        env.step(None if env.terminations[agent] else 3)
    assert env.agents == []
    with pytest.raises(RuntimeError, match=r"game is over.*call reset\(\) before step\(\)"):
        env.step(None)
    with pytest.raises(RuntimeError, match=r"game is over.*call reset\(\) before last\(\)"):
        env.last()
    env.observe("llm_0")  # the finished game can still be looked at
    env.reset(seed=1)
    env.step(3)  # and a reset starts a new one


def test_batched_game_calls_before_reset(tiny_tokenizer) -> None:
    game = batched_game(custom_task(QUERIES, word_count), batch_size=2, tokenizer=tiny_tokenizer)
    for call, what in [
        (lambda: game.step([3, 3]), r"step\(\)"),
        (lambda: game.observe("llm_0"), r"observe\(\)"),
        (lambda: game.info("llm_0"), r"info\(\)"),
        (lambda: game.done, "done"),
        (lambda: game.agent_selection, "agent_selection"),
        (lambda: game.roles, "roles"),
        (lambda: game.agents_by_role, "agents_by_role"),
    ]:
        with pytest.raises(RuntimeError, match=rf"call reset\(\) before {what}"):
            call()
    game.observation_space("llm_0")  # spaces exist before any episode


# ---------------------------------------------------------------- reward functions


@pytest.mark.parametrize(
    ("returned", "got"),
    [
        ("1111", r"got str '1111'"),  # not four scores
        (["1", "2"], r"got list of str \['1', '2'\] whose row 0 is str '1'"),
        (np.ones((2, 1)), r"got ndarray of shape \(2, 1\)"),
        ([[1.0], [2.0]], r"got list of list .* whose row 0 is list of float \[1.0\]"),
        ({"a": 1.0, "b": 2.0}, r"got dict"),
        ({1.0, 2.0}, r"got set"),
        (None, r"got NoneType None"),
        (3.0, r"got float 3.0"),
        ([1.0, None], r"whose row 1 is NoneType None"),
    ],
)
def test_reward_function_of_the_wrong_form(returned, got) -> None:
    def my_reward(queries, responses):
        return returned

    expected = r"one finite float per response \(a sequence of length 2\)"
    named = rf"task 'mine': reward function .*my_reward must return {expected}, got"
    with pytest.raises(RewardOutputError, match=named):
        scored(my_reward)
    with pytest.raises(RewardOutputError, match=got):
        scored(my_reward)


def test_reward_function_of_the_wrong_length_or_not_finite() -> None:
    message = (
        r"<lambda> returned 1 scores for 2 responses; it must return one finite float per "
        r"response \(a sequence of length 2\)"
    )
    with pytest.raises(ValueError, match=message):
        scored(lambda q, r: [1.0])
    with pytest.raises(ValueError, match=r"returned inf for row 1 \(response 'bad'\)"):
        scored(lambda q, r: [0.0, math.inf])


@pytest.mark.parametrize(
    "returned",
    [
        [1, 2.5],
        (1.0, 2.5),
        np.array([1.0, 2.5], dtype=np.float32),
        torch.tensor([1.0, 2.5]),
        [np.float64(1.0), torch.tensor(2.5)],  # 0-d arrays and tensors are numbers
        iter([1.0, 2.5]),
    ],
)
def test_reward_function_accepted_forms(returned) -> None:
    assert scored(lambda q, r: returned) == [1.0, 2.5]
    assert scored(lambda q, r: [True, False]) == [1.0, 0.0]  # right/wrong is 1/0


def test_reward_function_that_raises_is_named_and_chained() -> None:
    def flaky_reward(queries, responses):
        raise KeyError("label")

    message = r"task 'mine': reward function .*flaky_reward raised KeyError: 'label'"
    with pytest.raises(TaskFunctionError, match=message) as caught:
        scored(flaky_reward)
    assert isinstance(caught.value.__cause__, KeyError)


def test_reward_objects_and_partials_are_named() -> None:
    class Judge:
        def __call__(self, queries, responses):
            return "no"

    with pytest.raises(RewardOutputError, match=r"reward function .*Judge must return"):
        scored(Judge())

    def scaled(queries, responses, factor):
        return ["x"] * len(responses)

    with pytest.raises(RewardOutputError, match=r"reward function partial\(.*scaled\) must return"):
        scored(functools.partial(scaled, factor=2))


def test_reward_errors_reach_the_game(tiny_tokenizer) -> None:
    task = custom_task(["the movie"], lambda q, r: "1")
    env = text_game(task, max_new_tokens=1, tokenizer=tiny_tokenizer)
    env.reset(seed=0)
    env.step(3)
    message = r"task 'custom': reward function .*<lambda> must return"
    with pytest.raises(RewardOutputError, match=message):
        env.step(3)


# ---------------------------------------------------------------- prompt functions


@pytest.mark.parametrize(
    ("returned", "got"),
    [(None, "NoneType None"), (b"bytes", "bytes b'bytes'"), (["a"], r"list of str \['a'\]")],
)
def test_prompt_function_must_return_text(tiny_tokenizer, returned, got) -> None:
    def my_prompt(role, query, earlier):
        return returned

    task = custom_task(QUERIES, word_count, prompt_fn=my_prompt, name="mine")
    message = (
        rf"task 'mine': prompt function .*my_prompt must return a str \(the prompt text\), "
        rf"got {got}"
    )
    with pytest.raises(TypeError, match=message):
        task.prompt(0, task.queries[0], [])
    game = batched_game(task, batch_size=1, tokenizer=tiny_tokenizer)
    with pytest.raises(TypeError, match=message):
        game.reset(seed=0)


def test_prompt_function_that_raises_is_named_and_chained() -> None:
    def picky_prompt(role, query, earlier):
        return earlier[0]

    task = custom_task(QUERIES, word_count, prompt_fn=picky_prompt, name="mine")
    message = r"task 'mine': prompt function .*picky_prompt raised IndexError for role 0"
    with pytest.raises(TaskFunctionError, match=message) as caught:
        task.prompt(0, task.queries[0], [])
    assert isinstance(caught.value.__cause__, IndexError)


# ---------------------------------------------------------------- settings and inputs


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"role_exchange_period": True},
            r"game: role_exchange_period must be an integer >= 1"
            r", got True \(episodes between role exchanges\)",
        ),
        ({"role_exchange_period": 2.5}, r"role_exchange_period must be an integer >= 1, got 2.5"),
        ({"context_length": True}, r"game: context_length must be an integer >= 2, got True"),
        ({"lam": "1"}, r"game: lam must be a finite number, got '1' \(1 = CORY, 0 = independent"),
        ({"max_new_tokens": True}, r"max_new_tokens must be an integer >= 1 or a \(low, high\)"),
        ({"max_new_tokens": (4.5, 8)}, r"max_new_tokens must be .*got \(4.5, 8\)"),
        ({"batch_size": True}, r"game: batch_size must be an integer >= 1, got True"),
        ({"batch_size": 2.5}, r"game: batch_size must be an integer >= 1, got 2.5"),
    ],
)
def test_game_settings_refused_as_a_class(tiny_tokenizer, settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        batched_game(custom_task(QUERIES, word_count), tokenizer=tiny_tokenizer, **settings)


def test_game_settings_stored_canonically(tiny_tokenizer) -> None:
    task = custom_task(QUERIES, word_count)
    game = batched_game(
        task, batch_size=2.0, n_agents=3.0, lam=np.float32(0.5), tokenizer=tiny_tokenizer
    )
    assert (game.batch_size, game.n_agents, game.settings.lam) == (2, 3, 0.5)
    assert type(game.n_agents) is int and type(game.settings.lam) is float


def test_wrong_kinds_of_task_tokenizer_and_options(tiny_tokenizer) -> None:
    message = r"game: task must be a registered task name or a Task, got function"
    with pytest.raises(TypeError, match=message):
        batched_game(word_count, tokenizer=tiny_tokenizer)
    message = r"tokenizer for llm_1 must be a Hugging Face tokenizer or a model name/path, got int"
    with pytest.raises(TypeError, match=message):
        batched_game(custom_task(QUERIES, word_count), tokenizer=[tiny_tokenizer, 5])
    game = batched_game(custom_task(QUERIES, word_count), tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match=r"reset options: episode must be an integer >= 0, got -1"):
        game.reset(options={"episode": -1})
    with pytest.raises(ValueError, match=r"episode must be an integer >= 0, got 'two'"):
        game.reset(options={"episode": "two"})
    with pytest.raises(TypeError, match=r"reset: options must be a dict, got list"):
        game.reset(options=["episode", 2])
    game.reset(options={"episode": 3, "other": 1})  # other keys are PettingZoo's business
    assert game.episode == 3
    for seed in (True, -1, 1.5, "0"):
        with pytest.raises(ValueError, match=r"reset: seed must be an integer >= 0"):
            game.reset(seed=seed)
    game.reset(seed=np.int64(4))
    message = r"one entry per agent \['llm_0', 'llm_1'\]; missing \[\], unknown \['llm_2'\]"
    with pytest.raises(ValueError, match=message):
        tokenizers = {f"llm_{i}": tiny_tokenizer for i in range(3)}
        batched_game(custom_task(QUERIES, word_count), tokenizer=tokenizers)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: custom_task("hello", word_count),
            TypeError,
            r"task 'custom': queries must be a list of str or Query, got str 'hello'",
        ),
        (
            lambda: custom_task(["a", None], word_count),
            TypeError,
            r"queries must be a list of str or Query, but query 1 is NoneType None",
        ),
        (lambda: custom_task(["a", 7], word_count), TypeError, r"but query 1 is int 7"),
        (
            lambda: custom_task(["a"], word_count, name=""),
            ValueError,
            r"Task: name must be a non-empty string, got ''",
        ),
        (
            lambda: custom_task(["a"], "word_count"),
            TypeError,
            r"task 'custom': reward_fn must be callable, got str",
        ),
        (
            lambda: custom_task(["a"], word_count, prompt_fn=3),
            TypeError,
            r"task 'custom': prompt_fn must be callable, got int",
        ),
        (
            lambda: custom_task(["a"], word_count, context_length=1),
            ValueError,
            r"task 'custom': context_length must be an integer >= 2, got 1",
        ),
        (
            lambda: custom_task(["a"], word_count, metadata=[1]),
            TypeError,
            r"task 'custom': metadata must be a dict",
        ),
        (lambda: Query(5), TypeError, r"Query: text must be a str, got int 5"),
        (
            lambda: Query("q", 42),
            TypeError,
            r"Query: answer must be a str or None, got int 42 "
            r"\(give a number as text, e.g. '42'\)",
        ),
    ],
)
def test_task_and_query_inputs_refused_as_a_class(make, error, message) -> None:
    with pytest.raises(error, match=message):
        make()


def test_task_queries_from_a_generator() -> None:
    task = custom_task((f"query {i}" for i in range(3)), word_count)
    assert [q.text for q in task.queries] == ["query 0", "query 1", "query 2"]


# ---------------------------------------------------------------- pad token


def test_pad_token_rule(tiny_tokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    assert pad_token_id(tiny_tokenizer) == tiny_tokenizer.pad_token_id == 0
    no_pad = PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer.backend_tokenizer, eos_token="<eos>", unk_token="<unk>"
    )
    assert no_pad.pad_token is None
    assert pad_token_id(no_pad) == no_pad.eos_token_id  # the rule, without changing it
    assert no_pad.pad_token is None
    assert ensure_pad_token(no_pad) is no_pad
    assert no_pad.pad_token == "<eos>" and no_pad.pad_token_id == no_pad.eos_token_id
    bare = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    for helper in (pad_token_id, ensure_pad_token):
        with pytest.raises(ValueError, match="neither a pad nor an EOS token"):
            helper(bare)
    assert cory_env.pad_token_id is pad_token_id and cory_env.ensure_pad_token is ensure_pad_token


def test_game_pads_with_eos_when_the_tokenizer_has_no_pad(tiny_tokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    no_pad = PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer.backend_tokenizer, eos_token="<eos>", unk_token="<unk>"
    )
    game = batched_game(custom_task(QUERIES, word_count), batch_size=2, tokenizer=no_pad)
    game.reset(seed=0)
    obs = game.observe("llm_0")
    assert (obs["input_ids"][obs["attention_mask"] == 0] == no_pad.eos_token_id).all()


# ---------------------------------------------------------------- first run of the embedded model


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf package")
def test_embedded_conversion_is_announced(monkeypatch, tmp_path, capsys) -> None:
    import transformers

    import cory_env.models as models

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setenv("CORY_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_gguf_path", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    with pytest.raises(Stop):
        embedded_model_dir()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("cory: converting the embedded SmolLM2-135M-Instruct")
    assert str(tmp_path) in err and "happens once" in err
