"""One seat of the game as a prompt dataset and a reward function, the shape TRL's
``GRPOTrainer`` (and any prompt/completion/reward trainer) consumes.

:func:`seat_prompts` plays episodes up to the trained seat's turn (the partners answer
before it) and records each prompt with what replays it exactly: the episode number
(roles), the query, the token budget and the answers before it. :class:`SeatReward` scores a
completion by replaying that game, playing the completion as the seat's answer and the
partners after it, and paying what the game pays the seat: ``r_self + lam * sum(r_others)``
(CORY's collective reward at ``lam=1``) or, with ``reward="score"``, its own task score.

The trained seat answers once per game (``rounds=1``); with role exchange on, the dataset
holds episodes where it leads and episodes where it observes. Nothing here imports TRL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cory_env.core import BatchedTextGame
from cory_env.partners import Partner
from cory_env.seat_game import SeatGame

GameFactory = Callable[[], BatchedTextGame]
"""Makes a fresh one-game :class:`BatchedTextGame` with the game's settings."""


def _seat_game(
    make_game: GameFactory, seat: str, partners: Mapping[str, Partner] | Partner, reward: str
) -> SeatGame:
    game = make_game()
    if game.settings.rounds != 1:
        raise ValueError(
            f"a prompt/completion trainer gives one answer per prompt, so the seat answers once: "
            f"play rounds 1 (got {game.settings.rounds}); SeatGame plays several rounds"
        )
    return SeatGame(game, seat, partners, reward=reward)


def seat_prompts(
    make_game: GameFactory,
    seat: str,
    partners: Mapping[str, Partner] | Partner,
    n: int,
    seed: int = 0,
    first_episode: int = 0,
) -> list[dict[str, Any]]:
    """``n`` prompts of ``seat``, one per episode from ``first_episode`` (queries and budgets
    drawn with ``seed``): rows with ``prompt``, ``episode``, ``query``, ``budget``,
    ``answers_before`` and ``role`` (for a ``datasets.Dataset.from_list``)."""
    seat_game = _seat_game(make_game, seat, partners, "game")
    game = seat_game.game
    rng = np.random.default_rng(seed)
    rows = []
    for episode in range(first_episode, first_episode + n):
        query = int(rng.integers(0, len(game.task.queries)))
        budget = int(rng.integers(game.budget_low, game.budget_high + 1))
        options = {"episode": episode, "queries": [query], "budgets": [budget]}
        first = seat_game.reset(options=options)
        rows.append(
            {
                "prompt": first.prompt,
                "episode": episode,
                "query": query,
                "budget": budget,
                "answers_before": seat_game.answers_so_far(),
                "role": first.info["role"],
            }
        )
    return rows


class SeatReward:
    """A reward function ``(prompts, completions, episode, query, budget, answers_before,
    **kwargs) -> rewards``: each completion played as the seat's answer in its recorded game.

    ``last_games`` keeps the latest call's games (responses, scores, rewards) for logs.
    """

    def __init__(
        self,
        make_game: GameFactory,
        seat: str,
        partners: Mapping[str, Partner] | Partner,
        reward: str = "game",
    ) -> None:
        self.seat_game = _seat_game(make_game, seat, partners, reward)
        self.__name__ = f"cory_{seat}_{reward}"  # TRL logs a reward under its function's name
        self.last_games: list[dict[str, Any]] = []

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[Any],
        episode: Sequence[int],
        query: Sequence[int],
        budget: Sequence[int],
        answers_before: Sequence[Sequence[str]],
        **_: Any,
    ) -> list[float]:
        rewards, self.last_games = [], []
        for row, completion in enumerate(completions):
            options = {"episode": episode[row], "queries": [query[row]], "budgets": [budget[row]]}
            first = self.seat_game.reset(options=options, answers_before=answers_before[row])
            if first.prompt != _text(prompts[row]):
                raise ValueError(
                    f"row {row}: the replayed game's prompt is not the dataset's (were the "
                    "prompts made with other game settings or tokenizer?)"
                )
            result = self.seat_game.step(_text(completion))
            rewards.append(result.reward)
            self.last_games.append(result.info)
        return rewards


def _text(item: Any) -> str:
    """A standard-format prompt or completion is text; a conversational one, its messages."""
    if isinstance(item, str):
        return item
    if isinstance(item, list) and item and isinstance(item[-1], Mapping):
        return str(item[-1].get("content", ""))
    raise TypeError(f"expected a text or a list of messages, got {type(item).__name__}")
