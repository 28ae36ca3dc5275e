"""The turn-level game served over HTTP in OpenEnv's protocol (the ``openenv`` package).

OpenEnv's server keeps one environment per WebSocket session (``/ws``: ``reset``, ``step``,
``state`` messages; :mod:`cory_env.openenv_client` speaks it). Here a session is one seat
of the game (:class:`cory_env.seat_game.SeatGame`): ``reset`` chooses the seat to train
and, by name, the partners that answer for the other seats among those the server was
started with; each ``step`` is the seat's whole answer, and the reply is its next prompt,
what it was paid, and whether the game is over. An error (an unknown seat or partner, an
answer before ``reset`` or after the end or for another seat, a malformed message) is
answered with OpenEnv's error message and the session and server go on serving.

Start one::

    python -m cory_env.openenv_server --task imdb --port 8000 --partner embedded=embedded
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from cory_env.core import BatchedTextGame, split_settings
from cory_env.partners import Partner, fixed_partner, model_partner
from cory_env.seat_game import REWARDS, SeatGame

ENV_NAME = "cory_turn_game"


class TurnAction(Action):
    """The trained seat's whole answer; ``seat`` (optional) asserts who answers."""

    answer: str = Field(..., description="the seat's answer, as text")
    seat: str | None = Field(default=None, description="the answering seat (checked)")


class TurnObservation(Observation):
    """What the trained seat sees: its next prompt ("" once the game is over) and the game."""

    prompt: str = ""
    seat: str = ""
    role: str = ""
    roles: dict[str, str] = Field(default_factory=dict)
    episode: int = 0
    query: str = ""
    responses: dict[str, str] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)
    rewards: dict[str, float] = Field(default_factory=dict)
    """Every seat's pay over the game so far."""


class TurnState(State):
    """The session's game: the trained seat, its partners and the turns played."""

    seat: str | None = None
    partners: dict[str, str] = Field(default_factory=dict)
    turns_played: int = 0
    done: bool = False


class CoryTurnEnvironment(Environment[TurnAction, TurnObservation, TurnState]):
    """One session: one seat of a fresh one-game :class:`BatchedTextGame`."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own game; partners only read

    def __init__(
        self,
        make_game: Callable[[], BatchedTextGame],
        partners: Mapping[str, Partner],
        default_partner: str,
    ) -> None:
        super().__init__()
        self.make_game, self.partners, self.default_partner = make_game, partners, default_partner
        self.seat_game: SeatGame | None = None
        self.partner_names: dict[str, str] = {}
        self.steps = 0

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        seat: str = "llm_0",
        partners: Mapping[str, str] | None = None,
        episode: int | None = None,
        reward: str = "game",
        **unknown: Any,
    ) -> TurnObservation:
        """Start a game with ``seat`` to train; ``partners`` names each other seat's partner
        (default: the server's default partner); ``episode`` sets the roles."""
        if unknown:
            raise ValueError(
                f"unknown reset fields {sorted(unknown)}; reset takes seed, seat, partners, "
                "episode, reward"
            )
        game = self.make_game()
        if not isinstance(seat, str) or seat not in game.possible_agents:
            raise ValueError(f"unknown seat {seat!r}; the seats are {game.possible_agents}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {list(REWARDS)}, got {reward!r}")
        chosen = {a: self.default_partner for a in game.possible_agents if a != seat}
        if partners is not None:
            if not isinstance(partners, Mapping):
                raise ValueError(f"partners must map seats to partner names, got {partners!r}")
            not_seats = sorted(set(partners) - set(chosen))
            if not_seats:
                raise ValueError(f"partners for {not_seats}: not other seats than {seat!r}")
            chosen.update(partners)
        unknown_partners = sorted({str(p) for p in chosen.values()} - set(self.partners))
        if unknown_partners:
            raise ValueError(
                f"unknown partners {unknown_partners}; this server has {sorted(self.partners)}"
            )
        options = None if episode is None else {"episode": episode}
        self.seat_game = SeatGame(
            game, seat, {a: self.partners[p] for a, p in chosen.items()}, reward=reward
        )
        self.partner_names, self.steps = chosen, 0
        return self._observation(self.seat_game.reset(seed=seed, options=options))

    def step(self, action: TurnAction, timeout_s: float | None = None, **_: Any) -> TurnObservation:
        """Play the seat's answer and the partners after it."""
        if self.seat_game is None:
            raise RuntimeError("no game in this session: send reset first")
        if action.seat is not None and action.seat != self.seat_game.seat:
            raise ValueError(
                f"an answer for {action.seat!r}, but this session plays {self.seat_game.seat!r} "
                "(the partners answer for the other seats)"
            )
        if self.seat_game.game.done:
            raise RuntimeError("the game is over: send reset to start another")
        self.steps += 1
        return self._observation(self.seat_game.step(action.answer))

    def _observation(self, result: Any) -> TurnObservation:
        info = result.info
        return TurnObservation(
            prompt=result.prompt,
            done=result.done,
            reward=result.reward,
            seat=self.seat_game.seat,
            role=info["role"],
            roles=info["roles"],
            episode=info["episode"],
            query=info["query"],
            responses=info["responses"],
            scores=info["scores"],
            rewards=info["rewards"],
        )

    @property
    def state(self) -> TurnState:
        seat = self.seat_game
        return TurnState(
            step_count=self.steps,
            seat=None if seat is None else seat.seat,
            partners=dict(self.partner_names),
            turns_played=0 if seat is None else len(seat.game.turns),
            done=False if seat is None else seat.game.done,
        )


def make_app(
    task: Any = "imdb",
    partners: Mapping[str, Partner] | None = None,
    default_partner: str | None = None,
    max_sessions: int = 8,
    **settings: Any,
) -> Any:
    """A FastAPI app serving the game (``settings``: :func:`cory_env.text_game`'s, with
    ``tokenizer``); ``partners`` by name, the first the default unless named."""
    if not partners:
        raise ValueError("give the server at least one partner: {'name': partner}")
    default = default_partner if default_partner is not None else next(iter(partners))
    if default not in partners:
        raise ValueError(f"default partner {default!r} is not one of {sorted(partners)}")
    game_settings, _ = split_settings(settings)
    game_settings.validate()
    BatchedTextGame(task, batch_size=1, **settings)  # refuse bad settings at start, not later

    def make_env() -> CoryTurnEnvironment:
        game = BatchedTextGame(task, batch_size=1, **settings)
        return CoryTurnEnvironment(lambda: game, partners, default)

    return create_app(
        make_env,
        TurnAction,
        TurnObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions,
        state_cls=TurnState,
    )


def parse_partner(spec: str) -> tuple[str, Partner]:
    """``NAME=fixed:TEXT`` (always answers TEXT) or ``NAME=MODEL`` (a model name or folder,
    ``embedded`` the embedded default; greedy answers)."""
    name, sep, what = spec.partition("=")
    if not sep or not name or not what:
        raise argparse.ArgumentTypeError(
            f"a partner is NAME=fixed:TEXT or NAME=MODEL, got {spec!r}"
        )
    if what.startswith("fixed:"):
        return name, fixed_partner(what[len("fixed:") :])
    return name, model_partner(what)


def main(argv: list[str] | None = None) -> None:
    """Serve the game until stopped."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve the CORY game over OpenEnv's protocol.")
    parser.add_argument("--task", default="imdb")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenizer", default="embedded", help="cuts answers to the budget")
    parser.add_argument(
        "--partner",
        action="append",
        default=[],
        help="NAME=fixed:TEXT or NAME=MODEL (repeat; the first is the default)",
    )
    parser.add_argument(
        "--setting", action="append", default=[], help="a game setting KEY=VALUE (YAML value)"
    )
    parser.add_argument("--max_sessions", type=int, default=8)
    args = parser.parse_args(argv)
    import yaml

    settings = {}
    for item in args.setting:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--setting takes KEY=VALUE, got {item!r}")
        settings[key] = yaml.safe_load(value)
    partners = dict(parse_partner(s) for s in (args.partner or ["embedded=embedded"]))
    app = make_app(
        args.task,
        partners,
        tokenizer=args.tokenizer,
        max_sessions=args.max_sessions,
        **settings,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
