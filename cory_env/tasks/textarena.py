"""Two-player TextArena games as a task: TextArena's rules referee every move.

``--task textarena --task_settings "{env_id: TicTacToe-v0-train}"``: each row of the batch
is one TextArena match (seeded by its query); the acting seat's prompt is TextArena's
observation for its player (plus ``cue``), its answer is the move, which TextArena's action
wrapper and parser read, and TextArena's rewards (+1 win, -1 loss, 0 draw) are the scores.
An invalid move gets TextArena's own handling (by default one retry, then the game is lost)
and is counted. The game around it is ``cory_env.referee``'s: ``rounds`` caps each player's
moves, a seat's role is its player. Self-play with one policy is ``learners: {llm_0: ppo,
llm_1: llm_0}`` with ``lam: 0`` (each player its own result).

TextArena is an optional extra: ``pip install 'cory[textarena]'``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from cory_env import checks
from cory_env.query import Query
from cory_env.tasks.base import HeldOut, Task
from cory_env.tasks.registry import register_task

DEFAULT_ENV = "TicTacToe-v0-train"
"""Moves a small model can learn to write (a cell number), over at most 9 moves; the
``-train`` wrappers show the board and the last moves, not the whole history."""
HELD_OUT_SEED = 1_000_000
"""Evaluation matches are seeded from here on, apart from any training match's seed."""


def require_textarena() -> Any:
    """The ``textarena`` module, or one line that says how to install it."""
    if importlib.util.find_spec("textarena") is None:
        raise checks.SettingError(
            "task textarena needs the textarena package: pip install 'cory[textarena]' (or "
            "pip install textarena)"
        )
    import textarena

    return textarena


class TextArenaMatch:
    """One TextArena match (a :class:`cory_env.referee.Match`)."""

    def __init__(self, env: Any, seed: int, cue: str) -> None:
        self.env = env
        self.cue = cue
        env.reset(num_players=2, seed=seed)
        self.over = False
        self.moves = [0, 0]
        """Moves each player wrote."""
        self.invalid = [0, 0]
        """Of them, those TextArena's rules refused."""
        self._observed: dict[int, str] = {}

    def to_move(self) -> int | None:
        return None if self.over else int(self.env.state.current_player_id)

    def observation(self, player: int) -> str:
        if player not in self._observed:  # TextArena hands each observation out once
            pid, text = self.env.get_observation()
            self._observed[int(pid)] = str(text)
        return self._observed.get(player, "") + self.cue

    def move(self, player: int, text: str) -> None:
        errors = self.env.state.error_count
        done, _ = self.env.step(text)
        self._observed.clear()
        self.moves[player] += 1
        state = self.env.state
        if state.error_count > errors or state.game_info[player].get("invalid_move"):
            self.invalid[player] += 1
        self.over = bool(done)

    def result(self) -> list[float] | None:
        if not self.over:
            return None
        rewards, _ = self.env.close()
        return [float(rewards.get(p, 0.0)) for p in range(2)]


class TextArenaReferee:
    """Starts one TextArena match per row (a :class:`cory_env.referee.Referee`)."""

    players = 2

    def __init__(self, env_id: str, cue: str) -> None:
        self.textarena = require_textarena()
        self.env_id = env_id
        self.cue = cue
        check_env(self.textarena, env_id)

    def start(self, queries: Sequence[Query]) -> list[TextArenaMatch]:
        return [
            TextArenaMatch(self.textarena.make(env_id=self.env_id), int(q.answer), self.cue)
            for q in queries
        ]

    def stats(self, matches: Sequence[TextArenaMatch]) -> dict[str, float]:
        """Each player's valid-move rate and, over the finished matches, win rate, and the
        draw rate (a match the turn cap cut is unfinished)."""
        finished = [m.result() for m in matches if m.over]
        n = max(len(finished), 1)
        out = {"finished": len(finished) / max(len(matches), 1)}
        for p in range(2):
            moves = sum(m.moves[p] for m in matches)
            invalid = sum(m.invalid[p] for m in matches)
            out[f"player_{p}_valid_move_rate"] = 1.0 - invalid / max(moves, 1)
            out[f"player_{p}_win_rate"] = sum(r[p] > r[1 - p] for r in finished) / n
        moves = sum(sum(m.moves) for m in matches)
        out["valid_move_rate"] = 1.0 - sum(sum(m.invalid) for m in matches) / max(moves, 1)
        out["draw_rate"] = sum(r[0] == r[1] for r in finished) / n
        return out


def check_env(textarena: Any, env_id: str) -> None:
    """Refuse an ``env_id`` TextArena does not know or that two players cannot play."""
    known = textarena.envs.registration.ENV_REGISTRY
    if env_id not in known:
        close = sorted(e for e in known if env_id.split("-")[0].lower() in e.lower())[:5]
        raise checks.SettingError(
            f"task_settings: env_id {env_id!r} is not a TextArena game"
            + (f"; close: {close}" if close else "; e.g. TicTacToe-v0-train, ConnectFour-v0")
        )
    try:
        textarena.make(env_id=env_id).reset(num_players=2, seed=0)
    except Exception as err:  # TextArena says so with an assertion or a ValueError
        raise checks.SettingError(
            f"task_settings: env_id {env_id!r} is not a two-player game ({err}); this task "
            "plays two-player TextArena games, e.g. TicTacToe-v0-train"
        ) from None


def textarena_held_out(settings: dict[str, Any]) -> HeldOut:
    note = "held-out matches: seeds from 1,000,000 on, apart from the training seeds"
    return HeldOut({**settings, "first_seed": HELD_OUT_SEED}, note, True)


@register_task("textarena", held_out=textarena_held_out)
def make_textarena_task(
    env_id: str = DEFAULT_ENV,
    n_queries: int = 256,
    first_seed: int = 0,
    cue: str = "\nYour move:",
    max_new_tokens: int | tuple[int, int] = 4,
    context_length: int = 512,
) -> Task:
    """A two-player TextArena game (module doc): ``n_queries`` matches seeded
    ``first_seed``, ``first_seed + 1``, ...; ``cue`` ends every prompt."""
    checks.text(env_id, "env_id", where="task_settings")
    checks.integer(n_queries, "n_queries", minimum=1, where="task_settings")
    checks.integer(first_seed, "first_seed", minimum=0, where="task_settings")
    if not isinstance(cue, str):
        raise checks.fail("task_settings: cue", "text that ends every prompt", cue)
    referee = TextArenaReferee(env_id, cue)
    queries = [
        Query(f"{env_id} match {seed}", answer=str(seed))
        for seed in range(first_seed, first_seed + n_queries)
    ]
    return Task(
        name="textarena",
        queries=queries,
        reward_fn=_unused_reward,
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={"env_id": env_id},
        referee=referee,
    )


def _unused_reward(queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
    """A refereed task's rewards are its matches' results (``cory_env.referee``)."""
    raise RuntimeError("a refereed task is scored by its referee, not a reward function")
