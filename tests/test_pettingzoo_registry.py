"""The game in PettingZoo's registry: ``import cory_env`` registers ``cory/TextGame-v0``, and
``pettingzoo.make("aec", "cory/TextGame-v0", task=...)`` is ``cory_env.text_game(task=...)``,
which passes PettingZoo's own tests when made that way."""

from __future__ import annotations

import warnings

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import api_test, seed_test

import cory_env

pytestmark = pytest.mark.skipif(
    not hasattr(pettingzoo, "register"), reason="this PettingZoo has no registry (< 1.27)"
)

SETTINGS = {"max_new_tokens": 3, "context_length": 96}
"""A short game (the budget of tests/test_env.py's API tests): the task's prompts fit."""


@pytest.fixture(scope="module")
def embedded_tokenizer():
    return cory_env.load_tokenizer("embedded")  # the tokenizer only: no model loads


def test_import_registers_the_game() -> None:
    assert cory_env.PETTINGZOO_ID == "cory/TextGame-v0"
    assert cory_env.PETTINGZOO_ID in pettingzoo.aec_registry
    assert pettingzoo.spec("aec", "cory/TextGame-v0").entry_point is cory_env.text_game
    assert pettingzoo.spec("aec", "cory/TextGame").id == "cory/TextGame-v0"  # the latest


# Advisory only: our observation is a Dict (ids, mask, role, count) by design.
@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
@pytest.mark.parametrize("n_agents", [1, 2])
def test_made_from_the_registry_passes_pettingzoo_tests(embedded_tokenizer, n_agents) -> None:
    def make():
        return pettingzoo.make(
            "aec",
            "cory/TextGame-v0",
            task="imdb",
            n_agents=n_agents,
            tokenizer=embedded_tokenizer,
            **SETTINGS,
        )

    env = make()
    assert isinstance(env, cory_env.TextGameEnv)
    assert isinstance(env, pettingzoo.AECEnv)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not fit context_length")
        api_test(make(), num_cycles=20)
        seed_test(make, num_cycles=20)


def test_registry_env_plays_as_text_game(embedded_tokenizer) -> None:
    """The same arguments, the same seed, the same actions: the same game."""
    settings = {"task": "imdb", "tokenizer": embedded_tokenizer, **SETTINGS}

    def play(env):
        env.reset(seed=3)
        rng, seen = np.random.default_rng(0), []
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, info = env.last()
            seen.append((agent, obs["input_ids"].tolist(), float(reward)))
            done = terminated or truncated
            env.step(None if done else int(rng.integers(env.action_space(agent).n)))
        return seen

    assert play(pettingzoo.make("aec", "cory/TextGame-v0", **settings)) == play(
        cory_env.text_game(**settings)
    )


def test_registry_refuses_what_text_game_refuses() -> None:
    with pytest.raises(ValueError, match="group_size"):
        pettingzoo.make("aec", "cory/TextGame-v0", task="imdb", group_size=2)


@pytest.mark.filterwarnings("ignore:Observation is not a NumPy array")
@pytest.mark.filterwarnings("ignore:Observation space for each agent probably")
def test_the_turn_level_face_is_registered_too(embedded_tokenizer) -> None:
    """``cory/TurnGame-v0`` is :func:`cory_env.turn_game`: one whole answer a step."""
    assert pettingzoo.spec("aec", cory_env.PETTINGZOO_TURN_ID).entry_point is cory_env.turn_game
    env = pettingzoo.make("aec", "cory/TurnGame-v0", task="imdb", tokenizer=embedded_tokenizer)
    assert isinstance(env.unwrapped, cory_env.TurnGameEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(env, num_cycles=3)
