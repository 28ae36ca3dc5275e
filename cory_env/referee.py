"""Games whose rules live outside this library (TextArena's): a referee per task, a match
per row of the batch.

A task with a ``referee`` is played by its rules instead of a prompt template and a
reward function: the acting seat's prompt is the match's observation for its player, the
seat's answer is the player's move, and the match's result is the reward. A seat's role is
its player (the pioneer is player 0). The batched game still plays ``n_agents * rounds``
turns in role order; in a turn, a row whose match does not wait for that seat's player
(the other player must retry an invalid move, or the match is over) takes no token: its
turn is empty. ``rounds`` caps every match at that many turns per player; a match the cap
cuts pays 0 to each player. A match that ends pays each player its result at the end of
the round it ended in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cory_env.query import Query


class Match(Protocol):
    """One game of an outside rule set, for one row of the batch."""

    def to_move(self) -> int | None:
        """The player whose move the match waits for; None once it is over."""

    def observation(self, player: int) -> str:
        """What ``player`` reads before its move: its prompt."""

    def move(self, player: int, text: str) -> None:
        """Play ``text`` as ``player``'s move (the rules decide what it does)."""

    def result(self) -> list[float] | None:
        """Each player's reward once the match is over; None before."""


class Referee(Protocol):
    """Starts a batch's matches and counts what happened in them."""

    players: int
    """How many players a match has (the game's ``n_agents`` must equal it)."""

    def start(self, queries: Sequence[Query]) -> list[Match]:
        """One new match per row, set up by its query (e.g. the match's seed)."""

    def stats(self, matches: Sequence[Match]) -> dict[str, float]:
        """Figures of the batch's finished matches (rates of valid moves, wins, ...)."""
