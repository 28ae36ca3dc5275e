"""cory_env: the CORY game (pioneer answers, observer answers seeing it) as PettingZoo envs.

import cory_env
env = cory_env.text_game(task="imdb")          # PettingZoo AECEnv, one game
game = cory_env.batched_game("imdb", batch_size=64)   # B games in lock-step
seat = cory_env.single_seat("arith", seat="llm_1")     # gymnasium.Env of one seat
env = pettingzoo.make("aec", "cory/TextGame-v0", task="imdb")  # text_game, from the registry
env = cory_env.turn_game(task="imdb")          # the same game, one whole answer per step
"""

from __future__ import annotations

from typing import Any

import pettingzoo

from cory_env.aec import TextGameEnv, check_one_game
from cory_env.core import (
    GAME_SETTINGS,
    BatchedTextGame,
    GameSettings,
    role_name,
    split_settings,
)
from cory_env.models import (
    EMBEDDED,
    ensure_pad_token,
    load_causal_lm,
    load_tokenizer,
    pad_token_id,
)
from cory_env.query import Query
from cory_env.seat_game import SeatGame
from cory_env.single_seat import SingleSeatEnv, single_seat
from cory_env.small_vocab import SMALL_VOCAB_ARITH, ArithScriptedPlayer, small_vocab_tokenizer
from cory_env.tasks import (
    Task,
    TaskFunctionError,
    available_tasks,
    custom_task,
    make_task,
    register_task,
)
from cory_env.turn_game import TurnGameEnv, play_answers, turn_game


def text_game(
    task: str | Task = "imdb", render_mode: str | None = None, **settings: Any
) -> TextGameEnv:
    """The CORY game as a PettingZoo ``AECEnv``.

    ``settings`` are game settings (``n_agents``, ``lam``, ``role_exchange_period``,
    ``max_new_tokens``, ``context_length``, ``sees``, ``tokenizer``; see
    :class:`GameSettings`) and the task's own settings. One game is played at a time, so
    ``group_size`` must be 1 and ``reward_norm`` False (both need a batch).
    """
    game_settings, _ = split_settings(settings)
    game_settings.validate()
    check_one_game(game_settings)  # before the batched game refuses batch_size=1 less clearly
    return TextGameEnv(BatchedTextGame(task, batch_size=1, **settings), render_mode=render_mode)


def batched_game(
    task: str | Task = "imdb", batch_size: int = 64, **settings: Any
) -> BatchedTextGame:
    """B games in lock-step with array observations, actions and rewards (same rules)."""
    return BatchedTextGame(task, batch_size=batch_size, **settings)


PETTINGZOO_ID = "cory/TextGame-v0"
"""The game's id in PettingZoo's registry: ``pettingzoo.make("aec", "cory/TextGame-v0",
task="imdb", ...)`` is :func:`text_game` with the same arguments."""
PETTINGZOO_TURN_ID = "cory/TurnGame-v0"
"""The same game one whole answer a step (:func:`turn_game`, docs/turn_level.md)."""


def _register_with_pettingzoo() -> None:
    """Put :func:`text_game` in PettingZoo's registry of AEC envs (PettingZoo 1.27 has
    ``pettingzoo.register``; older versions have no registry, and then nothing is done).
    Only the AEC form is registered: the batched game is not a PettingZoo ``ParallelEnv``
    (its agents act in turn, not at once)."""
    register = getattr(pettingzoo, "register", None)
    registry = getattr(pettingzoo, "aec_registry", None)
    if register is None or registry is None:
        return
    for env_id, entry_point in ((PETTINGZOO_ID, text_game), (PETTINGZOO_TURN_ID, turn_game)):
        if env_id not in registry:
            register("aec", env_id, entry_point=entry_point)


_register_with_pettingzoo()


__all__ = [
    "EMBEDDED",
    "GAME_SETTINGS",
    "SMALL_VOCAB_ARITH",
    "ArithScriptedPlayer",
    "BatchedTextGame",
    "GameSettings",
    "PETTINGZOO_ID",
    "PETTINGZOO_TURN_ID",
    "Query",
    "SeatGame",
    "SingleSeatEnv",
    "Task",
    "TaskFunctionError",
    "TextGameEnv",
    "TurnGameEnv",
    "available_tasks",
    "batched_game",
    "custom_task",
    "ensure_pad_token",
    "load_causal_lm",
    "load_tokenizer",
    "make_task",
    "pad_token_id",
    "play_answers",
    "register_task",
    "role_name",
    "single_seat",
    "small_vocab_tokenizer",
    "text_game",
    "turn_game",
]
