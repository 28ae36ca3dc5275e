"""What players and logs read of the game (:class:`GameViews`, a part of
:class:`cory_env.core.BatchedTextGame`): the spaces, each agent's observation and info,
the roles of an episode, the global state, and the state a resumed run continues from.
The rules that change the game (reset, step, pay) are in ``cory_env/core.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from cory_env import checks
from cory_env.settings import role_name, roles_for_episode


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars made Python ints (JSON has no numpy types)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    return value


class GameViews:
    """The reading side of the game; :class:`cory_env.core.BatchedTextGame` holds the
    arrays it reads."""

    def observation_space(self, agent: str) -> spaces.Dict:
        return self._observation_spaces[self._check_agent(agent)]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_spaces[self._check_agent(agent)]

    def _check_agent(self, agent: str) -> str:
        if agent not in self._observation_spaces:
            raise KeyError(f"unknown agent {agent!r}; agents are {self.possible_agents}")
        return agent

    # ----------------------------------------------------------------- roles
    def roles_for_episode(self, episode: int) -> list[int]:
        """Role index of each agent: the pioneer seat moves every ``role_exchange_period``."""
        return roles_for_episode(episode, self.n_agents, self.settings.role_exchange_period)

    def _require_started(self, what: str) -> None:
        if not self._started:
            raise RuntimeError(f"call reset() before {what}: no episode has started")

    @property
    def agents_by_role(self) -> list[str]:
        """This episode's agents in role order: the pioneer first."""
        self._require_started("agents_by_role")
        return [self.possible_agents[i] for i in self._order]

    @property
    def roles(self) -> dict[str, str]:
        """Each agent's role name in this episode."""
        self._require_started("roles")
        return {
            a: role_name(r, self.n_agents)
            for a, r in zip(self.possible_agents, self._role_of, strict=False)
        }

    # ----------------------------------------------------------------- state
    STATE_KEYS = ("next_episode", "rng")

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue this game's episodes exactly: the number of
        the next episode (it sets the roles) and the RNG that draws queries and budgets.

        Plain ints, strings and dicts only, so that it can be stored as JSON.
        """
        return {
            "next_episode": int(self.next_episode),
            "rng": _plain(self.np_random.bit_generator.state),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next ``reset()`` plays what it would have."""

        def invalid(why: str) -> ValueError:
            return ValueError(f"the game state is not valid: {why}")

        if not isinstance(state, Mapping):
            raise invalid(f"expected a dict with keys {list(self.STATE_KEYS)}, got {state!r}")
        missing = [k for k in self.STATE_KEYS if k not in state]
        unknown = sorted(str(k) for k in state if k not in self.STATE_KEYS)
        if missing or unknown:
            raise invalid(f"missing keys {missing}, unknown keys {unknown}")
        try:
            episode = checks.integer(state["next_episode"], "next_episode", minimum=0)
        except checks.SettingError as err:
            raise invalid(str(err)) from None
        rng_state = state["rng"]
        kind = type(self.np_random.bit_generator).__name__
        if not isinstance(rng_state, Mapping) or rng_state.get("bit_generator") != kind:
            raise invalid(f"'rng' must be the state of a {kind} generator, got {rng_state!r}")
        generator = np.random.Generator(type(self.np_random.bit_generator)())
        try:
            generator.bit_generator.state = dict(rng_state)
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            raise invalid(f"'rng' is not a {kind} state ({err!r})") from None
        self.np_random = generator
        self.next_episode = episode

    def match_stats(self) -> dict[str, float]:
        """A refereed task's figures of this batch's matches (valid moves, wins); {} for
        other tasks."""
        if self.matches is None:
            return {}
        return self.task.referee.stats(self.matches)

    # ----------------------------------------------------------------- views
    def observe(self, agent: str) -> dict[str, np.ndarray]:
        """Left-padded context of ``agent`` (its prompt and its tokens so far), batched."""
        i = self.possible_agents.index(self._check_agent(agent))
        self._require_started("observe()")
        L = self.context_length
        length = self._length[i]
        idx = np.arange(L)[None, :] + length[:, None] - L
        valid = idx >= 0
        ids = np.take_along_axis(self._ids[i], np.maximum(idx, 0), axis=1)
        ids[~valid] = self._pad[i]
        return {
            "input_ids": ids,
            "attention_mask": valid.astype(np.int64),
            "role": np.full(self.batch_size, self._role_of[i], dtype=np.int64),
            "num_generated": self._generated[i].copy(),
            "budget": self.budgets.copy(),
        }

    def info(self, agent: str) -> dict[str, Any]:
        """What a learner or a log wants besides the observation: texts, roles, scores, and
        with several rounds the round and each agent's reward per round so far."""
        i = self.possible_agents.index(self._check_agent(agent))
        self._require_started("info()")
        info = {
            "role": role_name(self._role_of[i], self.n_agents),
            "roles": self.roles,
            "episode": self.episode,
            "budget": self.budget,
            "queries": [q.text for q in self.queries],
            "responses": dict(self.responses),
            "scores": dict(self.scores),
        }
        if self.settings.rounds > 1:
            info["round"] = self.round
            info["turn_rewards"] = {a: list(r) for a, r in self.turn_rewards.items()}
        return info

    # ----------------------------------------------------------------- global state
    def state_space(self) -> spaces.Box:
        """One game's global state: a row of token ids for the query, then one per turn, each
        left-aligned and filled with -1 (no token); ids are each agent's own tokenizer's."""
        high = max(self._vocab) - 1
        return spaces.Box(-1, high, (1 + self.n_turns, self.context_length), np.int64)

    def state(self) -> np.ndarray:
        """The global state of every game, ``(B, 1 + n_turns, context_length)``: the query
        (the pioneer seat's tokens, its last ``context_length``) and every answer so far;
        turns not played yet are -1. :meth:`state_text` is the same as text."""
        self._require_started("state()")
        B, L = self.batch_size, self.context_length
        out = np.full((B, 1 + self.n_turns, L), -1, dtype=np.int64)
        if self._query_ids is None:
            encoded = self.tokenizers[0]([q.text for q in self.queries])["input_ids"]
            self._query_ids = out[:, 0].copy()
            for b, ids in enumerate(encoded):
                ids = ids[-L:]
                self._query_ids[b, : len(ids)] = ids
        out[:, 0] = self._query_ids
        for record in self.turns:
            for b, ids in enumerate(record.tokens):
                out[b, 1 + record.turn, : len(ids)] = ids
        return out

    def state_text(self) -> list[dict[str, Any]]:
        """The global state as text, one dict per game: the query and every turn so far."""
        self._require_started("state_text()")
        return [
            {
                "query": q.text,
                "turns": [
                    {
                        "turn": t.turn,
                        "round": t.round,
                        "role": t.role,
                        "agent": t.agent,
                        "text": t.responses[b],
                    }
                    for t in self.turns
                ],
            }
            for b, q in enumerate(self.queries)
        ]
