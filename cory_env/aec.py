"""The CORY game as a PettingZoo AEC env: the batched rules with one game (B=1)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pettingzoo import AECEnv

from cory_env.core import BatchedTextGame, GameSettings


def check_one_game(settings: GameSettings) -> None:
    """Refuse the settings that need a batch of games: the AEC env plays one (B=1)."""
    if settings.group_size != 1:
        raise ValueError(
            f"the AEC env plays one game at a time (B=1), so group_size must be 1, got "
            f"{settings.group_size}; play groups with BatchedTextGame (cory_env.batched_game) "
            "and a batch_size that is a multiple of group_size"
        )
    if settings.reward_norm:
        raise ValueError(
            "the AEC env plays one game at a time (B=1): reward_norm standardises scores over "
            "a batch, and over one game every reward would be 0; use BatchedTextGame "
            "(cory_env.batched_game) with batch_size > 1, or reward_norm=False"
        )


class TextGameEnv(AECEnv):
    """Sequential text game: each agent answers token by token, in role order.

    Rewards arrive when a paid round ends (the last, or every one with
    ``pay_every_round``); when the last round ends every agent is terminated and steps once
    with ``None``, as in any PettingZoo AEC env.
    """

    metadata = {
        "name": "cory_text_game_v0",
        "render_modes": ["human", "ansi"],
        "is_parallelizable": False,
    }

    def __init__(self, game: BatchedTextGame, render_mode: str | None = None) -> None:
        super().__init__()
        if game.batch_size != 1:
            raise ValueError("TextGameEnv plays one game at a time; use BatchedTextGame for B > 1")
        check_one_game(game.settings)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.game = game
        self.render_mode = render_mode
        self.possible_agents = list(game.possible_agents)
        self.agents: list[str] = []
        self._has_reset = False

    def _require(self, what: str, *, live: bool = False) -> None:
        """A clear error where PettingZoo's defaults would raise KeyError or AttributeError."""
        if not self._has_reset:
            raise RuntimeError(f"call reset() before {what}: no game has started")
        if live and not self.agents:
            raise RuntimeError(
                f"the game is over: every agent has finished and stepped with None; call "
                f"reset() before {what}"
            )

    def observation_space(self, agent: str):  # noqa: D102 - same object every call
        return self.game.observation_space(agent)

    def action_space(self, agent: str):  # noqa: D102
        return self.game.action_space(agent)

    @property
    def state_space(self):  # noqa: D102 - PettingZoo's name
        return self.game.state_space()

    def state(self) -> np.ndarray:
        """The query and every answer so far as token ids (``BatchedTextGame.state``); the
        same as text in ``state_text()``. A centralised critic reads it (docs/multi_round.md)."""
        self._require("state()")
        return self.game.state()[0]

    def state_text(self) -> dict[str, Any]:
        self._require("state_text()")
        return self.game.state_text()[0]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.game.reset(seed=seed, options=options)
        self._has_reset = True
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: self._info(a) for a in self.agents}
        self.agent_selection = self.game.agent_selection
        self._turns_seen = 0

    def observe(self, agent: str) -> dict[str, Any]:
        self._require("observe()")
        batched = self.game.observe(agent)
        return {
            "input_ids": batched["input_ids"][0],
            "attention_mask": batched["attention_mask"][0],
            "role": int(batched["role"][0]),
            "num_generated": int(batched["num_generated"][0]),
            "budget": int(batched["budget"][0]),
        }

    def _info(self, agent: str) -> dict[str, Any]:
        info = self.game.info(agent)
        out = {
            "role": info["role"],
            "roles": info["roles"],
            "episode": info["episode"],
            "budget": info["budget"],
            "query": info["queries"][0],
            "responses": {a: texts[0] for a, texts in info["responses"].items()},
            "scores": {a: float(s[0]) for a, s in info["scores"].items()},
        }
        if "round" in info:  # several rounds: which round, and what each round paid whom
            out["round"] = info["round"]
            out["turn_rewards"] = {
                a: [float(r[0]) for r in paid] for a, paid in info["turn_rewards"].items()
            }
        return out

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._require("last()", live=True)
        return super().last(observe)

    def _finished_step(self, agent: str, action: Any) -> bool:
        """Whether ``agent`` has finished its episode, after taking PettingZoo's dead step
        (``None``, the only action it may take; anything else is refused)."""
        if not (self.terminations[agent] or self.truncations[agent]):
            return False
        if action is not None:
            raise ValueError(
                f"{agent} has finished its episode; the only valid action is None "
                f"(got {action!r:.200}). Call reset() to start a new game."
            )
        self._was_dead_step(action)
        return True

    def step(self, action: Any) -> None:
        self._require("step()", live=True)
        agent = self.agent_selection
        if self._finished_step(agent, action):
            return
        if action is None:
            raise ValueError(f"{agent} is acting and needs a token id, got None")
        if np.ndim(action) != 0:
            raise ValueError(
                f"action for {agent} must be one token id (a scalar), got shape {np.shape(action)}"
            )
        paid = len(self.game.turn_rewards[agent])
        self.game.step(np.asarray([action]), agent=agent)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        if len(self.game.turn_rewards[agent]) > paid:  # a round ended: each agent's pay
            for a in self.agents:
                self.rewards[a] = float(self.game.turn_rewards[a][-1][0])
        if self.game.done:
            for a in self.agents:
                self.terminations[a] = True
            self.infos = {a: self._info(a) for a in self.agents}
        elif len(self.game.turns) > self._turns_seen:  # a turn ended: new responses
            self.infos = {a: self._info(a) for a in self.agents}
        self._turns_seen = len(self.game.turns)
        self.agent_selection = self.game.agent_selection
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def render(self) -> str | None:
        self._require("render()")
        info = self._info(self.agent_selection)
        lines = [f"query: {info['query']!r}"]
        for a, text in info["responses"].items():
            score = info["scores"].get(a)
            tail = "" if score is None else f"  (score {score:+.3f})"
            lines.append(f"{a} [{info['roles'][a]}]: {text!r}{tail}")
        out = "\n".join(lines)
        if self.render_mode == "human":
            print(out)
            return None
        return out

    def close(self) -> None:
        pass
