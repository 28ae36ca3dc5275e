"""The game's settings and its roles: what :class:`GameSettings` holds and checks, who
plays which role in an episode, and the reward normalisation. A leaf of ``cory_env``: the
game (``cory_env/core.py``) plays by these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cory_env import checks
from cory_env.tasks.base import budget_range


def roles_for_episode(episode: int, n_agents: int, period: int) -> list[int]:
    """Role index of each agent in ``episode``: the pioneer seat moves every ``period``."""
    shift = (episode // period) % n_agents
    return [(i - shift) % n_agents for i in range(n_agents)]


def role_name(role: int, n_agents: int) -> str:
    """``pioneer`` for role 0, ``observer`` for role 1, ``observer_k`` further down a chain."""
    if role == 0:
        return "pioneer"
    return "observer" if role == 1 and n_agents == 2 else f"observer_{role}"


SEES = ("previous", "all", "none")
"""Values of the ``sees`` setting: who a later agent sees."""
MAX_ROUNDS = 64
"""The turn cap: at most this many rounds, so that every episode ends."""


@dataclass(frozen=True)
class GameSettings:
    """Settings of the game itself; everything else goes to the task.

    - ``n_agents``: agents ``llm_0..llm_{n-1}``; 1 is plain single-agent RL.
    - ``lam``: agent i is paid ``r_i + lam * sum(r_others)`` (1 = CORY's collective
      reward, 0 = independent, -1 = zero-sum).
    - ``role_exchange_period``: episodes between role exchanges; the pioneer seat moves
      to the next agent every that many episodes. A period longer than the run (e.g.
      ``10**9``) turns exchanges off: ``llm_0`` stays the pioneer.
    - ``max_new_tokens``: the token budget of an answer, instead of the task's: ``n``, or
      ``[low, high]`` drawn per episode in ``low..high-1``.
    - ``context_length``: the padded observation length, instead of the task's; a longer
      prompt keeps its last tokens.
    - ``sees``: who a later agent sees: ``previous``, ``all`` or ``none``. ``"previous"``
      (default, a chain): role r's prompt shows the answer of role r-1 only. ``"all"``: role r
      sees the answers of roles 0..r-1, in role order. ``"none"`` (the paper's no-knowledge-
      transfer ablation): every agent answers the query alone with the pioneer's (role 0)
      prompt, yet is still paid ``r_self + lam * sum(r_others)``. The task's prompt function
      gets the answers this setting lets the role see (and, for ``"none"``, role 0 and no
      answers).
    - ``group_size``: each query is played this many times in one batch (for RLOO / GRPO
      baselines): a batch draws ``batch_size // group_size`` queries and repeats each in
      consecutive rows, so rows ``[g*k, (g+1)*k)`` share query ``g``. ``batch_size`` must
      be a multiple of it; the single-game AEC env needs 1.
    - ``reward_norm``: standardise each agent's task scores over the batch (mean 0, std 1;
      a batch of equal scores is just centred, i.e. 0) before mixing them with ``lam``, as
      the rebuttal did when comparing lam values. ``scores`` keep the raw task scores;
      only ``rewards`` are normalised.
    - ``rounds``: how many times every agent answers, in role order (1: CORY's game).
    - ``pay_every_round``: score and pay every round's answers, each agent ``r_self + lam *
      sum(r_others)`` within its round; false: only the last round's (the default).
    """

    n_agents: int = 2
    lam: float = 1.0
    role_exchange_period: int = 5
    max_new_tokens: int | tuple[int, int] | None = None
    context_length: int | None = None
    sees: str = "previous"
    group_size: int = 1
    reward_norm: bool = False
    rounds: int = 1
    pay_every_round: bool = False

    def __post_init__(self) -> None:
        checks.plain_numbers(self)  # 2.0 agents is 2, lam 1 is 1.0

    def validate(self) -> None:
        """Refuse bad values (and bools where numbers are meant) before any work is done;
        nothing is changed (numbers took their declared types at construction)."""
        where = "game"
        checks.integer(self.n_agents, "n_agents", minimum=1, where=where)
        checks.number(self.lam, "lam", where=where, hint="1 = CORY, 0 = independent, -1 = zero-sum")
        checks.integer(
            self.role_exchange_period,
            "role_exchange_period",
            minimum=1,
            where=where,
            hint="episodes between role exchanges",
        )
        checks.choice(self.sees, "sees", SEES, where=where)
        checks.integer(
            self.group_size,
            "group_size",
            minimum=1,
            where=where,
            hint="times each query is played in one batch",
        )
        checks.boolean(self.reward_norm, "reward_norm", where=where)
        checks.integer(
            self.rounds,
            "rounds",
            minimum=1,
            maximum=MAX_ROUNDS,
            where=where,
            hint="times every agent answers in an episode; 1 = CORY's game",
        )
        checks.boolean(self.pay_every_round, "pay_every_round", where=where)
        if self.context_length is not None:
            checks.integer(self.context_length, "context_length", minimum=2, where=where)
        if self.max_new_tokens is not None:
            budget_range(self.max_new_tokens, where)


GAME_SETTINGS = tuple(GameSettings.__dataclass_fields__)


def standardise(values: np.ndarray) -> np.ndarray:
    """``values`` with mean 0 and (population) std 1; equal values give zeros (centred).

    Equal values are caught exactly, not by a small std: the mean of ``[0.1] * 3`` is not
    exactly 0.1, and dividing that rounding error by its own tiny std would give +-1.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(values == values.flat[0]):
        return np.zeros_like(values)
    centred = values - values.mean()
    std = centred.std()
    return centred / std if std > 0 else centred  # std 0 (underflow): just centred


def split_settings(settings: Mapping[str, Any]) -> tuple[GameSettings, dict[str, Any]]:
    """Separate game settings from task settings."""
    game = {k: v for k, v in settings.items() if k in GAME_SETTINGS}
    task = {k: v for k, v in settings.items() if k not in GAME_SETTINGS}
    return GameSettings(**game), task
