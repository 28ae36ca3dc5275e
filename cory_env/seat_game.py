"""One seat of the turn-level game, the other seats answered by partners inside it.

This is what a single-policy trainer steps (a TRL reward function, an OpenEnv client):
``reset()`` plays the partners up to the seat's first turn and returns its prompt text;
``step(answer)`` plays the seat's answer and the partners after it, up to the seat's next
turn or the end, and returns what the seat was paid meanwhile. Several trainers can share
one game by each training its own seat against the others' latest policies as partners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cory_env.core import BatchedTextGame
from cory_env.partners import Partner
from cory_env.turn_game import play_answers

REWARDS = ("game", "score")
"""What the seat is paid: the game's pay (``r_self + lam * sum(r_others)``: CORY's collective
reward at lam 1, per round paid) or its own raw task score of the last round (at the end)."""


@dataclass
class SeatStep:
    """What the seat sees after ``reset`` or ``step``."""

    prompt: str
    """Its next prompt text; ``""`` once the game is over."""
    reward: float
    """What it was paid since its last answer (0 before it answers)."""
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class SeatGame:
    """``seat`` of a one-game :class:`BatchedTextGame`; ``partners`` answer for the others."""

    def __init__(
        self,
        game: BatchedTextGame,
        seat: str = "llm_0",
        partners: Mapping[str, Partner] | Partner | None = None,
        reward: str = "game",
    ) -> None:
        if game.batch_size != 1:
            raise ValueError(
                f"a seat game plays one game at a time, got batch_size {game.batch_size}"
            )
        if seat not in game.possible_agents:
            raise KeyError(f"unknown seat {seat!r}; the seats are {game.possible_agents}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        others = [a for a in game.possible_agents if a != seat]
        if partners is None or callable(partners):
            partners = {a: partners for a in others}
        unknown = sorted(set(partners) - set(others))
        missing = [a for a in others if partners.get(a) is None]
        if unknown or missing:
            raise ValueError(
                f"partners must answer for every other seat {others}: missing {missing}, "
                f"not another seat {unknown}"
            )
        self.game, self.seat, self.reward = game, seat, reward
        self.partners = dict(partners)
        self._paid = 0.0

    def reset(
        self,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        answers_before: Sequence[str] | None = None,
    ) -> SeatStep:
        """Start a game (``BatchedTextGame.reset``'s seed and options) and play up to the seat's
        turn. ``answers_before`` replays given answers for the turns before it instead of asking
        the partners (to score a prompt recorded earlier exactly)."""
        self.game.reset(seed=seed, options=dict(options) if options else None)
        self._paid = 0.0
        self._play_others(list(answers_before) if answers_before is not None else None)
        return self._result()

    def step(self, answer: str) -> SeatStep:
        """Play the seat's answer, then the partners up to its next turn or the end."""
        if self.game.done:
            raise RuntimeError("the game is over; call reset()")
        play_answers(self.game, [answer], agent=self.seat)
        self._play_others()
        return self._result()

    def _play_others(self, given: list[str] | None = None) -> None:
        while not self.game.done and self.game.agent_selection != self.seat:
            agent = self.game.agent_selection
            if given is not None:
                if not given:
                    raise ValueError(
                        "answers_before has fewer answers than turns before the seat's"
                    )
                answer = given.pop(0)
            else:
                answer = self.partners[agent](self.game.prompt_texts[0])
            play_answers(self.game, [answer], agent=agent)
        if given:
            raise ValueError(
                f"answers_before has {len(given)} answers more than turns before the seat's"
            )

    def _result(self) -> SeatStep:
        game = self.game
        if self.reward == "game":
            total = float(game.rewards[self.seat][0])
        else:  # its own raw score of the last round, paid when the game ends
            total = float(game.scores[self.seat][0]) if game.done else 0.0
        reward, self._paid = total - self._paid, total
        info = game.info(self.seat)
        info = {
            "role": info["role"],
            "roles": info["roles"],
            "episode": info["episode"],
            "query": info["queries"][0],
            "responses": {a: texts[0] for a, texts in info["responses"].items()},
            "scores": {a: float(s[0]) for a, s in info["scores"].items()},
            "rewards": {a: float(r[0]) for a, r in game.rewards.items()},
            "turns_played": len(game.turns),
        }
        prompt = "" if game.done else game.prompt_texts[0]
        return SeatStep(prompt=prompt, reward=reward, done=game.done, info=info)

    def answers_so_far(self) -> list[str]:
        """Every turn's answer so far, in order (to record a prompt for exact replay)."""
        return [t.responses[0] for t in self.game.turns]
