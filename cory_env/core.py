"""The rules of the text game, for B games in lock-step.

One implementation serves both forms: :class:`BatchedTextGame` is the fast form that
learners train on, and the PettingZoo AEC env (``cory_env.aec``) is this class with B=1.

A game: every agent answers the same query in turn, in role order. Role 0 (the pioneer)
sees the query; what role r sees besides is the ``sees`` setting: the answer of role r-1
(``"previous"``, the default chain), the answers of roles 0..r-1 (``"all"``) or none
(``"none"``: every agent gets the pioneer's prompt), always through the task's prompt
template. One step is one token from the acting agent for every row; a row's turn ends at
EOS or at the episode's token budget, and the agent's turn ends when all rows have ended.
When the last role finishes, each answer is scored by the task's reward function (one
batched call) and agent i receives ``s_i + lam * sum(s_others)`` (with ``reward_norm``,
each agent's scores are first standardised over the batch).

With ``rounds`` > 1 the agents answer again, round after round, in the same role order; an
answer after the first round sees, through the task's template, the latest answers of the
others that ``sees`` allows (``previous``: the one answered just before it, which for the
pioneer is the last role's of the round before) and its own last answer, oldest first.
Every round is scored and paid (``pay_every_round``), or only the last (the earlier turns
earn through the learner's discount). An episode has ``n_agents * rounds`` turns of at
most the budget each, so it always ends.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from cory_env import checks
from cory_env.game_setup import GameSetup
from cory_env.game_views import GameViews
from cory_env.models import EMBEDDED, pad_token_id
from cory_env.query import Query
from cory_env.settings import (
    GAME_SETTINGS,
    MAX_ROUNDS,
    SEES,
    GameSettings,
    role_name,
    roles_for_episode,
    split_settings,
    standardise,
)
from cory_env.tasks import Task, make_task, task_needs_tokenizer
from cory_env.tasks.base import budget_range

__all__ = [  # the settings' names are the game's too: cory_env.core has always had them
    "GAME_SETTINGS",
    "MAX_ROUNDS",
    "SEES",
    "BatchedTextGame",
    "GameSettings",
    "TurnRecord",
    "role_name",
    "roles_for_episode",
    "split_settings",
    "standardise",
]


@dataclass(frozen=True)
class TurnRecord:
    """One turn of an episode: who answered, in which round and role, and what."""

    turn: int
    round: int
    role: int
    agent: str
    responses: list[str]
    tokens: list[np.ndarray]
    """Each row's answer as token ids of the agent's tokenizer."""


class BatchedTextGame(GameSetup, GameViews):
    """B text games played in lock-step, with array observations, actions and rewards.

    With ``group_size=k`` the B rows are ``B // k`` groups of k rows that share a query
    (rows ``[g*k, (g+1)*k)``); every row still samples its own answers. Typical loop::

        game = BatchedTextGame("imdb", batch_size=64)
        game.reset(seed=0)
        while not game.done:
            agent = game.agent_selection
            game.step(policy[agent](game.observe(agent)))
        game.rewards   # {agent: (B,) array}

    Actions of rows whose turn already ended are ignored. Its parts: the setup checks
    (``game_setup.py``) and what players read (``game_views.py``); settings: ``settings.py``.
    """

    def __init__(
        self,
        task: str | Task = "imdb",
        batch_size: int = 1,
        *,
        tokenizer: Any = EMBEDDED,
        **settings: Any,
    ) -> None:
        game_settings, task_settings = split_settings(settings)
        game_settings.validate()
        batch_size = checks.integer(batch_size, "batch_size", minimum=1, where="game")
        if batch_size % game_settings.group_size:
            raise checks.fail(
                "batch_size",
                f"a multiple of group_size ({game_settings.group_size})",
                batch_size,
                "game",
                "each drawn query is played group_size times in consecutive rows",
            )
        if not isinstance(task, (str, Task)):
            raise TypeError(
                f"game: task must be a registered task name or a Task, got "
                f"{type(task).__name__} {task!r}"
            )
        self.settings = game_settings
        self.n_agents = game_settings.n_agents
        self.possible_agents = [f"llm_{i}" for i in range(self.n_agents)]
        self.tokenizers = self._agent_tokenizers(tokenizer)
        if isinstance(task, Task):
            if task_settings:
                raise ValueError(
                    f"unknown settings {sorted(task_settings)} for a Task object; game settings "
                    f"are {list(GAME_SETTINGS)}"
                )
            self.task = task
        else:
            if "tokenizer" not in task_settings and task_needs_tokenizer(task):
                # Queries cut "to the first k tokens" are cut with the pioneer seat's tokenizer.
                task_settings["tokenizer"] = self.tokenizers[0]
            self.task = make_task(task, **task_settings)
        self._check_referee(game_settings)
        self._check_later_rounds(game_settings)
        self.batch_size = batch_size
        self.group_size = game_settings.group_size
        """Rows per query: rows ``[g*group_size, (g+1)*group_size)`` share query ``g``."""
        self.budget_low, self.budget_high = budget_range(
            game_settings.max_new_tokens
            if game_settings.max_new_tokens is not None
            else self.task.max_new_tokens
        )
        self.context_length = game_settings.context_length or self.task.context_length
        if self.context_length <= self.budget_high:
            raise ValueError(
                f"context_length ({self.context_length}) must exceed the largest token budget "
                f"({self.budget_high}) so that a prompt fits"
            )
        self._eos = [tok.eos_token_id for tok in self.tokenizers]
        self._pad = [pad_token_id(tok) for tok in self.tokenizers]
        self._vocab = [len(tok) for tok in self.tokenizers]
        self._observation_spaces = {
            agent: spaces.Dict(
                {
                    "input_ids": spaces.Box(
                        0, self._vocab[i] - 1, (self.context_length,), np.int64
                    ),
                    "attention_mask": spaces.Box(0, 1, (self.context_length,), np.int64),
                    "role": spaces.Discrete(self.n_agents),
                    "num_generated": spaces.Discrete(self.context_length + 1),
                    "budget": spaces.Discrete(self.context_length + 1),
                }
            )
            for i, agent in enumerate(self.possible_agents)
        }
        self._action_spaces = {
            agent: spaces.Discrete(self._vocab[i]) for i, agent in enumerate(self.possible_agents)
        }
        self.episode = 0
        """Number of the current episode (batch); it sets the roles."""
        self.next_episode = 0
        """Number the next ``reset()`` plays. Save and restore it to resume a run."""
        self.np_random, _ = seeding.np_random(None)
        self._warned_truncation = False
        self._started = False

    # ----------------------------------------------------------------- reset / step
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a new batch of games: draw the queries and a token budget, seat the pioneer.

        The draws, in this order from ``np_random``: ``integers(0, n_queries,
        size=batch_size // group_size)`` query indices (with replacement), each repeated
        ``group_size`` times in consecutive rows; then one token budget for the whole batch,
        ``integers(low, high + 1)``. With ``group_size=1`` that is one query per row.
        ``options={"episode": n}`` plays episode ``n`` (which sets the roles).

        ``options={"queries": [i, ...], "budgets": [n, ...]}`` plays exactly these games
        instead of drawing them: row b answers query ``i_b`` with a budget of ``n_b``
        tokens (an evaluation set fixes both per answer: ``cory_rl.train.evaluation.eval_set``).
        It takes
        ``batch_size`` of each and draws nothing, so the game's random stream is untouched.
        """
        # Other options are ignored, as PettingZoo's api_test expects of an env.
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset: options must be a dict, got {type(options).__name__}")
        if seed is not None:
            seed = checks.integer(seed, "seed", minimum=0, where="reset")
            self.np_random, _ = seeding.np_random(seed)
        if options and "episode" in options:
            self.next_episode = checks.integer(
                options["episode"], "episode", minimum=0, where="reset options"
            )
        self.episode, self.next_episode = self.next_episode, self.next_episode + 1
        self._started = True
        n, B, L = self.n_agents, self.batch_size, self.context_length
        self._role_of = self.roles_for_episode(self.episode)
        self._order = sorted(range(n), key=lambda i: self._role_of[i])
        if options and ("queries" in options or "budgets" in options):
            picks, budgets = self._given_rows(options)
        else:
            k = self.group_size
            picks = np.repeat(self.np_random.integers(0, len(self.task.queries), size=B // k), k)
            budgets = np.full(B, self.np_random.integers(self.budget_low, self.budget_high + 1))
        self.queries: list[Query] = [self.task.queries[i] for i in picks]
        self.budgets = budgets.astype(np.int64)
        """Each row's token budget (one drawn per batch in training; per answer when given)."""
        self.budget = int(self.budgets.max())
        """The largest budget of the batch (all rows share it unless given row by row)."""
        self._ids = np.empty((n, B, L), dtype=np.int64)
        for i in range(n):
            self._ids[i] = self._pad[i]
        self._length = np.zeros((n, B), dtype=np.int64)
        self._generated = np.zeros((n, B), dtype=np.int64)
        self.active = np.zeros(B, dtype=bool)
        self.responses: dict[str, list[str]] = {}
        """Each agent's latest answer per row."""
        self.scores: dict[str, np.ndarray] = {}
        """Each agent's raw task scores of the latest round scored."""
        self.rewards: dict[str, np.ndarray] = {a: np.zeros(B) for a in self.possible_agents}
        """Each agent's reward over the episode so far (the sum of its turns' rewards)."""
        self.turn_rewards: dict[str, list[np.ndarray]] = {a: [] for a in self.possible_agents}
        """Each agent's reward per turn (one (B,) array per round it answered): 0 for a round
        not paid."""
        self.turns: list[TurnRecord] = []
        """The turns played so far, in order."""
        self._query_ids: np.ndarray | None = None
        referee = self.task.referee
        self.matches = None if referee is None else referee.start(self.queries)
        """A refereed task's match per row (``cory_env.referee``); None otherwise."""
        self._paid_matches = np.zeros(B, dtype=bool)
        self._moving: np.ndarray | None = None
        self._turn = 0
        self._start_turn()

    @property
    def n_turns(self) -> int:
        """Turns in an episode: every agent once per round."""
        return self.n_agents * self.settings.rounds

    @property
    def round(self) -> int:
        """The round being played (the last one once the game is done)."""
        self._require_started("round")
        return min(self._turn, self.n_turns - 1) // self.n_agents

    @property
    def done(self) -> bool:
        """Whether every agent has answered in every round (the rewards are then set)."""
        self._require_started("done")
        return self._turn >= self.n_turns

    @property
    def agent_selection(self) -> str:
        """The acting agent (the last agent once the game is done)."""
        self._require_started("agent_selection")
        return self.possible_agents[self._order[min(self._turn, self.n_turns - 1) % self.n_agents]]

    def seen_roles(self, role: int) -> list[int]:
        """The roles whose answers ``role``'s prompt shows (the ``sees`` setting)."""
        sees = self.settings.sees
        if sees == "none" or role == 0:
            return []
        return [role - 1] if sees == "previous" else list(range(role))

    def _seen_answers(self, role: int) -> list[list[str]]:
        """The answers ``role``'s prompt shows this turn, oldest first: in the first round the
        earlier roles' that ``sees`` allows; later, the latest answer of each other role
        ``sees`` allows (``previous``: the role just before, cyclically) and its own."""
        by_role = self.agents_by_role
        if self._turn < self.n_agents:
            return [self.responses[by_role[r]] for r in self.seen_roles(role)]
        n, sees = self.n_agents, self.settings.sees
        if sees == "previous":
            others = [(role - 1) % n] if n > 1 else []
        else:
            others = [] if sees == "none" else [r for r in range(n) if r != role]
        seen = [*others, role]
        # a role before this one answered this round; one after it (or itself), the last round
        seen.sort(key=lambda r: (r < role, r))
        return [self.responses[by_role[r]] for r in seen]

    def _start_turn(self) -> None:
        role = self._turn % self.n_agents
        i = self._order[role]
        earlier = self._seen_answers(role)
        # "none": every agent answers alone, with the pioneer's prompt (in the first round);
        # a prompt that shows answers is a later role's.
        if self._turn < self.n_agents:
            prompt_role = 0 if self.settings.sees == "none" else role
        else:
            prompt_role = max(role, 1)
        self._generated[i] = 0
        if self.matches is not None:  # the rules say who moves; the others wait (empty turn)
            self._moving = np.array([m.to_move() == role for m in self.matches])
            prompts = [
                m.observation(role) if moving else q.text
                for m, moving, q in zip(self.matches, self._moving, self.queries, strict=True)
            ]
        else:
            prompts = [
                self.task.prompt(prompt_role, q, [answers[b] for answers in earlier])
                for b, q in enumerate(self.queries)
            ]
        self.prompt_texts = prompts
        """Each row's prompt of this turn as text, before tokenization (the turn-level face's
        observation, ``cory_env.turn_game``)."""
        encoded = self.tokenizers[i](prompts)["input_ids"]
        for b, ids in enumerate(encoded):
            room = self.context_length - int(self.budgets[b])
            if len(ids) > room:
                if not self._warned_truncation:
                    warnings.warn(
                        f"a {len(ids)}-token prompt for {self.possible_agents[i]} does not fit "
                        f"context_length={self.context_length} with a {self.budgets[b]}-token "
                        "budget; keeping its last tokens (raise context_length to avoid this)",
                        stacklevel=3,
                    )
                    self._warned_truncation = True
                ids = ids[-room:]
            self._ids[i, b, : len(ids)] = ids
            self._length[i, b] = len(ids)
        self.active[:] = True if self.matches is None else self._moving

    def step(self, actions: Any, agent: str | None = None) -> None:
        """Append one token per row for the acting agent; ``agent`` asserts whose turn it is."""
        self._require_started("step()")
        if self.done:
            raise RuntimeError("the game is over: every agent has answered; call reset()")
        acting = self.agent_selection
        if agent is not None and agent != acting:
            raise ValueError(f"step for agent {agent!r}, but it is the turn of {acting!r}")
        i = self._order[self._turn % self.n_agents]
        tokens = self._check_actions(acting, i, actions)
        rows = np.flatnonzero(self.active)
        self._ids[i, rows, self._length[i, rows]] = tokens[rows]
        self._length[i, rows] += 1
        self._generated[i, rows] += 1
        ended = (
            (tokens[rows] == self._eos[i])
            | (self._generated[i, rows] >= self.budgets[rows])
            | (self._length[i, rows] >= self.context_length)
        )
        self.active[rows[ended]] = False
        if not self.active.any():
            self._end_turn(i)

    def _check_actions(self, agent: str, i: int, actions: Any) -> np.ndarray:
        arr = np.asarray(actions)
        if arr.shape != (self.batch_size,):
            raise ValueError(
                f"actions for {agent} must have shape ({self.batch_size},) (one token id per "
                f"game), got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                arr = arr.astype(np.int64)
            else:
                raise ValueError(f"actions for {agent} must be integer token ids, got {arr.dtype}")
        arr = arr.astype(np.int64, copy=False)
        bad = self.active & ((arr < 0) | (arr >= self._vocab[i]))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"action {int(arr[row])} for {agent} at row {row} is not a token id: the "
                f"vocabulary has {self._vocab[i]} tokens (0..{self._vocab[i] - 1})"
            )
        return arr

    def _end_turn(self, i: int) -> None:
        agent = self.possible_agents[i]
        tok = self.tokenizers[i]
        generated = [
            self._ids[i, b, self._length[i, b] - self._generated[i, b] : self._length[i, b]]
            for b in range(self.batch_size)
        ]
        self.responses[agent] = tok.batch_decode(generated, skip_special_tokens=True)
        role = self._turn % self.n_agents
        tokens = [ids.copy() for ids in generated]  # the agent's next prompt overwrites them
        self.turns.append(
            TurnRecord(
                self._turn, self._turn // self.n_agents, role, agent, self.responses[agent], tokens
            )
        )
        if self.matches is not None:
            for b in np.flatnonzero(self._moving):
                self.matches[b].move(role, self.responses[agent][b])
        self._turn += 1
        round_over = self._turn % self.n_agents == 0
        if round_over:
            last = self._turn == self.n_turns
            refereed = self.matches is not None  # a match pays in the round it ends
            self._pay(scored=last or self.settings.pay_every_round or refereed)
        if self._turn < self.n_turns:
            self._start_turn()

    def _pay(self, scored: bool) -> None:
        """The round is over: score it (one batched reward call for all answers), then
        (normalise and) mix with ``lam``; a round not scored pays 0."""
        if not scored:
            for a in self.possible_agents:
                self.turn_rewards[a].append(np.zeros(self.batch_size))
            return
        order = self.possible_agents
        if self.matches is not None:
            raw = self._match_results()
        else:
            queries = self.queries * self.n_agents
            responses = [r for a in order for r in self.responses[a]]
            flat = np.asarray(self.task.score(queries, responses), dtype=np.float64)
            raw = flat.reshape(self.n_agents, self.batch_size)
        mixed = np.stack([standardise(r) for r in raw]) if self.settings.reward_norm else raw
        total = mixed.sum(axis=0)
        lam = self.settings.lam
        first = not self.scores
        for k, a in enumerate(order):
            self.scores[a] = raw[k]
            paid = mixed[k] + lam * (total - mixed[k])
            self.turn_rewards[a].append(paid)
            self.rewards[a] = paid if first else self.rewards[a] + paid
        if self.matches is not None:  # a match's score is its result so far, not this round's
            for k, a in enumerate(order):
                player = self._role_of[k]
                self.scores[a] = np.array([(m.result() or [0.0] * 2)[player] for m in self.matches])

    def _match_results(self) -> np.ndarray:
        """Each agent's result (its player's: the player is its role) of the matches that
        ended since the last round; 0 where a match goes on or was paid already."""
        raw = np.zeros((self.n_agents, self.batch_size))
        for b, match in enumerate(self.matches):
            result = match.result()
            if result is not None and not self._paid_matches[b]:
                self._paid_matches[b] = True
                raw[:, b] = [result[self._role_of[k]] for k in range(self.n_agents)]
        return raw
