"""A config's game and how learners play it: shared by training, evaluation and play."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cory_env import BatchedTextGame
from cory_env.checks import SettingError
from cory_rl.agents.base import Learner
from cory_rl.train.config.train_config import TrainConfig


def make_game(
    config: TrainConfig,
    tokenizers: Any,
    *,
    task: Any = None,
    task_settings: dict[str, Any] | None = None,
    group_size: int | None = None,
    batch_size: int | None = None,
) -> BatchedTextGame:
    """The batched game of a config; ``tokenizers`` is one tokenizer or one per seat.

    Evaluation plays the same game on its own terms: another ``task_settings`` (the held-out
    split), or a ``task`` already built, with its own ``group_size`` and ``batch_size``."""
    settings: dict[str, Any] = (
        {}
        if task is not None
        else dict(config.task_settings if task_settings is None else task_settings)
    )
    game = dataclasses.asdict(config.game)
    if group_size is not None:
        game["group_size"] = group_size
    settings.update({k: v for k, v in game.items() if v is not None})  # None: the task's
    return BatchedTextGame(
        config.task if task is None else task,
        batch_size=config.batch_size if batch_size is None else batch_size,
        tokenizer=tokenizers,
        **settings,
    )


def owners(learners: dict[str, Learner]) -> dict[str, Learner]:
    """Each learner once, under the first seat it plays: a learner that several seats share
    (``learners: {llm_1: llm_0}``) is one agent, which learns, saves and exports once."""
    return {seats[0]: learners[seats[0]] for seats in seats_of(learners).values()}


def seats_of(learners: dict[str, Learner]) -> dict[str, list[str]]:
    """The seats each learner plays, under the first of them, in seat order."""
    first: dict[int, str] = {}
    out: dict[str, list[str]] = {}
    for agent, learner in learners.items():
        out.setdefault(first.setdefault(id(learner), agent), []).append(agent)
    return out


def play_games(game: BatchedTextGame, learners: dict[str, Learner], collect: bool = False) -> None:
    """Play the current batch of games to the end (evaluation stops here: nothing is kept).

    Every learner hears when the game moves on from its turn (``turn_over``: a sharded
    learner frees the weights it gathered for the turn). ``collect``: in a game of several
    rounds, or for a learner that plays several seats, each learner hears of each of its
    turns' end (``end_turn``), to learn from them all."""
    acting = None
    turns = 0
    several_seats = {a for seats in seats_of(learners).values() if len(seats) > 1 for a in seats}
    ending = {a for a in learners if game.settings.rounds > 1 or a in several_seats}
    ending = ending if collect else set()
    while not game.done:
        agent = game.agent_selection
        if agent != acting:
            _turn_over(learners, acting)
            acting = agent
        game.step(learners[agent].act(game.observe(agent)), agent=agent)
        if ending and len(game.turns) > turns:
            turns = len(game.turns)
            record = game.turns[-1]
            if record.agent in ending:
                learners[record.agent].end_turn(np.array([len(ids) for ids in record.tokens]))
    _turn_over(learners, acting)


def episode_rewards(game: BatchedTextGame, agent: str) -> np.ndarray:
    """What ``end_rollout`` gets: the rewards ``(B,)`` of one round, or ``(B, rounds)``,
    one column per turn, of several, NaN for a turn of a round the game did not score
    (``pay_every_round`` false: every round but the last), which paid nothing."""
    settings = game.settings
    if settings.rounds == 1:
        return game.rewards[agent]
    rewards = np.stack(game.turn_rewards[agent], axis=1).astype(np.float64)
    if not settings.pay_every_round:
        rewards[:, :-1] = np.nan
    return rewards


def learner_rewards(game: BatchedTextGame, seats: list[str]) -> np.ndarray:
    """What ``end_rollout`` gets from a learner's ``seats``: one seat's
    :func:`episode_rewards`; of several (a shared learner), ``(B, turns)``, one column per
    turn it played, in the order played (its ``end_turn`` calls), NaN for a turn not paid."""
    if len(seats) == 1:
        return episode_rewards(game, seats[0])
    settings = game.settings
    last = settings.rounds - 1
    columns = [
        game.turn_rewards[t.agent][t.round]
        if settings.pay_every_round or t.round == last
        else np.full(game.batch_size, np.nan)
        for t in game.turns
        if t.agent in seats
    ]
    return np.stack(columns, axis=1).astype(np.float64)


def check_multi_turn(game: BatchedTextGame, learners: dict[str, Learner]) -> None:
    """Refuse a game of several rounds, or a learner in several seats, for a learner that
    learns from one turn an episode."""
    rounds = game.settings.rounds
    single = {a: type(x).__name__ for a, x in learners.items() if not x.multi_turn}
    if rounds > 1 and single:
        raise SettingError(
            f"rounds {rounds}: the learners of {sorted(single)} ({sorted(set(single.values()))}) "
            "learn from one turn an episode; seat learners that learn from several (ppo, "
            "reinforce, rloo, grpo) or play rounds 1"
        )
    for seats in seats_of(learners).values():
        if len(seats) > 1 and seats[0] in single:
            raise SettingError(
                f"learners: {seats} share a {single[seats[0]]}, which learns from one turn an "
                "episode; a learner in several seats learns from the turns of all of them: "
                "share one that does (ppo, reinforce, rloo, grpo) or give each seat its own"
            )


def _turn_over(learners: dict[str, Learner], agent: str | None) -> None:
    if agent is not None:
        learners[agent].turn_over()


def batch_samples(game: BatchedTextGame, n: int) -> list[dict[str, Any]]:
    """The first ``n`` games of the batch: query, then each role's answer, score and reward."""
    roles = game.roles
    out = []
    for b in range(min(n, game.batch_size)):
        sample: dict[str, Any] = {"query": game.queries[b].text}
        for agent in game.agents_by_role:
            sample[roles[agent]] = {
                "agent": agent,
                "response": game.responses[agent][b],
                "score": float(game.scores[agent][b]),
                "reward": float(game.rewards[agent][b]),
            }
        out.append(sample)
    return out
