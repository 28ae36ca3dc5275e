"""What a game is set up from, checked before it plays (:class:`GameSetup`, a part of
:class:`cory_env.core.BatchedTextGame`): each seat's tokenizer, whether the task's prompts
can carry a game of several rounds or a refereed match, and the rows a reset is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cory_env import checks
from cory_env.models import load_tokenizer
from cory_env.settings import GameSettings


class GameSetup:
    """The setup checks of the game; :class:`cory_env.core.BatchedTextGame` calls them."""

    def _agent_tokenizers(self, tokenizer: Any) -> list[Any]:
        if isinstance(tokenizer, (list, tuple)):
            if len(tokenizer) != self.n_agents:
                raise ValueError(
                    f"got {len(tokenizer)} tokenizers for {self.n_agents} agents; give one "
                    "tokenizer, or one per agent"
                )
            items = list(tokenizer)
        elif isinstance(tokenizer, Mapping):
            missing = [a for a in self.possible_agents if a not in tokenizer]
            unknown = [a for a in tokenizer if a not in self.possible_agents]
            if missing or unknown:
                raise ValueError(
                    f"game: the tokenizer mapping must have one entry per agent "
                    f"{self.possible_agents}; missing {missing}, unknown {unknown}"
                )
            items = [tokenizer[a] for a in self.possible_agents]
        else:
            items = [tokenizer] * self.n_agents
        loaded = [load_tokenizer(t) if isinstance(t, str) else t for t in items]
        for agent, tok in zip(self.possible_agents, loaded, strict=True):
            missing = [
                name
                for name in ("__call__", "__len__", "batch_decode", "eos_token_id")
                if not hasattr(tok, name)
            ]
            if missing:
                raise TypeError(
                    f"game: the tokenizer for {agent} must be a Hugging Face tokenizer or a "
                    f"model name/path, got {type(tok).__name__} (it lacks {missing})"
                )
        return loaded

    def _given_rows(self, options: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The ``queries`` and ``budgets`` reset options, checked: one of each per row."""
        where = "reset options"
        if "queries" not in options or "budgets" not in options:
            raise ValueError(
                f"{where}: give both 'queries' and 'budgets' (one per row), or neither"
            )
        rows = {}
        for name, low, high in (
            ("queries", 0, len(self.task.queries) - 1),
            ("budgets", 1, self.context_length - 1),
        ):
            values = np.asarray(options[name])
            if values.shape != (self.batch_size,) or values.dtype.kind not in "iu":
                raise ValueError(
                    f"{where}: {name!r} must be {self.batch_size} integers (one per row), got "
                    f"{values.dtype} of shape {values.shape}"
                )
            bad = (values < low) | (values > high)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"{where}: {name}[{row}] = {int(values[row])} is outside {low}..{high}"
                )
            rows[name] = values.astype(np.int64)
        return rows["queries"], rows["budgets"]

    def _check_later_rounds(self, settings: GameSettings) -> None:
        """In a game of several rounds a later turn's prompt must show the answers so far:
        the task's prompt for a later round is asked to show a probe answer, once."""
        if settings.rounds == 1 or self.task.referee is not None:
            return
        probe = "probe7531answer"
        query = self.task.queries[0]
        if probe not in self.task.prompt(1, query, [probe]):
            raise checks.SettingError(
                f"rounds {settings.rounds}: task {self.task.name!r}'s prompt for a later round "
                "does not show the earlier answers (its prompt for role 1 left the answer out), "
                "so a revision would not see what it revises; give the task a template that "
                "shows them (custom: observer_template with {answer}) or play rounds 1"
            )

    def _check_referee(self, settings: GameSettings) -> None:
        """A refereed task's game seats its players and pays each its own result."""
        referee = self.task.referee
        if referee is None:
            return
        if settings.n_agents != referee.players:
            raise checks.SettingError(
                f"task {self.task.name!r} is a {referee.players}-player game: set n_agents "
                f"{referee.players} (got {settings.n_agents})"
            )
        if settings.lam >= 1:
            raise checks.SettingError(
                f"lam {settings.lam}: in a game won by one player and lost by the other, "
                "r_self + lam * r_other pays nothing at lam 1 (and rewards losing above it); "
                "set --lam 0 (each player its own result)"
            )
