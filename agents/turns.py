"""An agent's turns of one game as one trajectory: what a learner needs in a game of
several rounds (``rounds`` > 1).

A learner's rollout keeps one row per turn (its own prompt, which shows the earlier
answers, and its answer), so every forward of the update is the one-round one. What
changes is the credit: an agent's turns of one game are one trajectory, its tokens turn
after turn. :class:`Chains` lays each trajectory out as one right-padded row of its valid
tokens, in turn order, so that GAE and returns-to-go run over it exactly as over one
answer: the value at the first token of the agent's next turn bootstraps the last token of
this one, and a turn's reward reaches the earlier turns through ``gamma``. The critic-free
group learners take a per-turn return instead (:func:`turn_returns`), grouped per query and
turn (AT-GRPO's groups).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from cory_rl.agents import pg_math as pg
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.rollout import Rollout, rollout_rows


@dataclass
class Chains:
    """Where each position of a trajectory row comes from: ``rows``/``cols`` index the
    rollout's (R, T) token tensors; ``mask`` is 1 on the trajectory's tokens (E, L)."""

    rows: torch.Tensor  # (E, L) long
    cols: torch.Tensor  # (E, L) long
    mask: torch.Tensor  # (E, L) float

    @classmethod
    def of(cls, mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> Chains:
        """The trajectories of a rollout's rows: one per ``episode``, rows in ``turn`` order,
        each row's valid tokens (``mask``, right-padded) in order."""
        lengths = mask.bool().sum(dim=1).tolist()
        order = sorted(range(len(lengths)), key=lambda r: (int(episode[r]), int(turn[r])))
        chains: dict[int, list[tuple[int, int]]] = {}
        for r in order:
            chain = chains.setdefault(int(episode[r]), [])
            chain.extend((r, c) for c in range(lengths[r]))
        width = max((len(c) for c in chains.values()), default=0)
        rows = torch.zeros(len(chains), width, dtype=torch.long)
        cols = torch.zeros(len(chains), width, dtype=torch.long)
        valid = torch.zeros(len(chains), width)
        for e, chain in enumerate(chains.values()):
            if chain:
                positions = torch.tensor(chain, dtype=torch.long)
                rows[e, : len(chain)], cols[e, : len(chain)] = positions[:, 0], positions[:, 1]
                valid[e, : len(chain)] = 1.0
        return cls(rows, cols, valid)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(R, T) per-token values as (E, L) trajectories; 0 on padding."""
        return torch.where(self.mask.bool(), x[self.rows, self.cols], torch.zeros(()))

    def scatter(self, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """(E, L) trajectories back to the rollout's (R, T) layout; 0 elsewhere."""
        out = torch.zeros_like(like)
        valid = self.mask.bool()
        out[self.rows[valid], self.cols[valid]] = y[valid].to(out.dtype)
        return out


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    episode: torch.Tensor | None = None,
    turn: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cory_rl.agents.ppo_math.gae` over each trajectory of turns (over each row
    when ``episode`` is None: a game of one round, computed as it always was)."""
    if episode is None:
        return pm.gae(rewards, values, mask, gamma, gae_lambda)
    chains = Chains.of(mask, episode, turn)
    advantages, returns = pm.gae(
        chains.gather(rewards), chains.gather(values), chains.mask, gamma, gae_lambda
    )
    return chains.scatter(advantages, rewards), chains.scatter(returns, rewards)


def returns_to_go(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    episode: torch.Tensor | None = None,
    turn: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`cory_rl.agents.pg_math.returns_to_go` over each trajectory of turns (over
    each row when ``episode`` is None)."""
    if episode is None:
        return pg.returns_to_go(rewards, mask, gamma)
    chains = Chains.of(mask, episode, turn)
    return chains.scatter(pg.returns_to_go(chains.gather(rewards), chains.mask, gamma), rewards)


def turn_returns(rewards: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """(B, K) per-turn rewards (NaN: a turn not paid, i.e. 0) to per-turn returns
    ``G_k = r_k + gamma * G_{k+1}``: what a critic-free group learner credits each turn."""
    paid = np.nan_to_num(np.asarray(rewards, dtype=np.float64), nan=0.0)
    out = np.zeros_like(paid)
    running = np.zeros(paid.shape[0])
    for k in reversed(range(paid.shape[1])):
        running = paid[:, k] + gamma * running
        out[:, k] = running
    return out


def without_empty_rows(rollout: Rollout) -> Rollout:
    """``rollout`` (one turn per game) minus the games in which no token was accepted: a
    refereed match over before this seat's turn. Nothing the seat did earned what such a
    row was paid, so it leaves the update whole (possibly every row)."""
    kept = rollout.mask.sum(dim=1) > 0
    if bool(kept.all()):
        return rollout
    return rollout_rows(rollout, kept.nonzero().flatten())


def without_empty_turns(rollout: Rollout) -> Rollout:
    """``rollout`` minus its empty turns (no token accepted: in a refereed game, a row whose
    match was over or waited on the other player). What an empty turn was paid goes to the
    latest earlier turn of its episode that has tokens (the last action that could have
    earned it); an episode with none has nothing to credit."""
    lengths = rollout.mask.sum(dim=1)
    empty = lengths == 0
    if not bool(empty.any()):
        return rollout
    rewards, paid = rollout.rewards.clone(), rollout.paid.clone()
    for row in empty.nonzero().flatten().tolist():
        same = (rollout.episode == rollout.episode[row]) & (rollout.turn < rollout.turn[row])
        earlier = (same & ~empty).nonzero().flatten()
        if len(earlier) and bool(paid[row]):
            target = earlier[rollout.turn[earlier].argmax()]
            rewards[target] += rewards[row]
            paid[target] = True
    rollout = dataclasses.replace(rollout, rewards=rewards, paid=paid)
    return rollout_rows(rollout, (~empty).nonzero().flatten())
