"""What an LLM learner records while it plays: a turn as it is played (prompt, KV cache,
per-token outputs) and a finished batch of turns (a rollout), with the helpers that cut
shared padding and order rows by prompt length for the model's forwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cory_rl.agents.engine_correction import WEIGHTS


@dataclass
class Turn:
    """What an agent records while it answers: its prompt, KV cache and per-token outputs."""

    prompt_ids: torch.Tensor  # (B, P) left-padded, on CPU
    prompt_mask: torch.Tensor  # (B, P)
    mask: torch.Tensor  # attention mask so far, on the device
    positions: torch.Tensor  # position ids of the last forward's inputs, on the device
    cache: Any = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    sample_logprobs: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    full_logprobs: list[torch.Tensor] = field(default_factory=list)
    entropies: list[torch.Tensor] = field(default_factory=list)
    engine_logprobs: list[torch.Tensor] = field(default_factory=list)  # the engine's, if it planned
    seen: tuple[torch.Tensor, torch.Tensor] | None = None  # ids in the context and which are real
    planned: bool = False  # the whole turn came from a rollout engine at its first step
    role: int = 0  # the role of the seat that plays it (0 = pioneer)

    @classmethod
    def start(cls, obs: dict[str, np.ndarray], device: torch.device) -> Turn:
        """From a turn's first observation, minus columns that are padding in every row."""
        ids = torch.as_tensor(np.asarray(obs["input_ids"]), dtype=torch.long)
        mask = torch.as_tensor(np.asarray(obs["attention_mask"]), dtype=torch.long)
        ids, mask = without_shared_padding(mask, ids, mask)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        role = int(np.asarray(obs["role"]).reshape(-1)[0]) if "role" in obs else 0
        return cls(ids, mask, mask.to(device), positions.to(device), role=role)


@dataclass
class Rollout:
    """One finished batch of B games from this agent's seat (tensors on CPU)."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    tokens: torch.Tensor  # (B, T) sampled tokens, right-padded
    mask: torch.Tensor  # (B, T) 1 where the token was accepted by the game
    logprobs: torch.Tensor  # (B, T) log pi(token) under the model at acting time
    sample_logprobs: torch.Tensor  # (B, T) log-prob under the distribution sampled from
    values: torch.Tensor  # (B, T) V(s_t) at acting time
    full_logprobs: torch.Tensor | None  # (B, T, V) for the exact KL
    rewards: torch.Tensor  # (B,) what the game paid (with lam, the mixed reward)
    engine_logprobs: torch.Tensor | None = None
    """(B, T) the rollout engine's log-prob of each token it sampled; None = no engine."""
    is_weights: torch.Tensor | None = None
    """(B, T) the engine correction's weights (``agents/engine_correction.py``), set when
    the learner takes the rollout to learn from it; None = no engine sampled."""
    episode: torch.Tensor | None = None
    """(B,) in a game of several rounds, the trajectory each row (one turn) belongs to:
    rows of one episode, in ``turn`` order, are one agent's turns of one game. None = every
    row is a whole episode (a game of one round)."""
    turn: torch.Tensor | None = None
    """(B,) with ``episode``: the row's turn within its episode (0 = the first)."""
    paid: torch.Tensor | None = None
    """(B,) bool with ``episode``: whether the game paid the row's turn (a turn of a round
    the game does not score has reward 0 and no place in the score statistics). None =
    every row was paid."""

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompt + response ids, attention mask and position ids, as one forward sees them."""
        ids = torch.cat([self.prompt_ids, self.tokens], dim=1)
        mask = torch.cat([self.prompt_mask, self.mask], dim=1)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def batch_tensors(self) -> dict[str, torch.Tensor]:
        """What every update forward needs, built once; mini-batches are rows of them."""
        ids, attention, positions = self.sequences()
        data = {
            "ids": ids,
            "attention": attention,
            "positions": positions,
            "tokens": self.tokens,
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "old_logprobs": self.sample_logprobs,
            "mask": self.mask.float(),
        }
        if self.is_weights is not None:
            data[WEIGHTS] = self.is_weights
        return data


def without_shared_padding(
    mask: torch.Tensor, *columns: torch.Tensor, keep: int = 1
) -> list[torch.Tensor]:
    """``columns`` (B, L) minus the leading columns that are padding in every row of
    ``mask``: no model computes them, and a real token attends to none of them, so the
    result is the same. The last ``keep`` columns always stay (a response, even one the
    game rejected, and the prompt position that predicts its first token)."""
    used = mask.any(dim=0).nonzero()
    last_allowed = mask.shape[1] - keep
    first = min(int(used[0]), last_allowed) if len(used) else last_allowed
    return [c[:, max(first, 0) :] for c in columns]


def by_prompt_length(rows: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered by prompt length, so that a chunk of neighbours shares its padding."""
    return rows[torch.argsort(prompt_mask[rows].sum(dim=1), stable=True)]


def response_logits(logits: torch.Tensor, steps: int) -> torch.Tensor:
    """From the last T+1 positions, the T that predicted the response tokens."""
    return logits[:, -steps - 1 : -1].float()


def rollout_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The games ``rows`` of ``rollout``, in that order."""

    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[rows]

    return Rollout(
        rollout.prompt_ids[rows],
        rollout.prompt_mask[rows],
        rollout.tokens[rows],
        rollout.mask[rows],
        rollout.logprobs[rows],
        rollout.sample_logprobs[rows],
        rollout.values[rows],
        pick(rollout.full_logprobs),
        rollout.rewards[rows],
        pick(rollout.engine_logprobs),
        pick(rollout.is_weights),
        pick(rollout.episode),
        pick(rollout.turn),
        pick(rollout.paid),
    )


def concat_rollouts(rollouts: list[Rollout], pad_token_id: int) -> Rollout:
    """One rollout of the games of ``rollouts`` in order: prompts left-padded and answers
    right-padded to the widest, as one batch would have been (padding is masked out). The
    episodes of rollouts of several turns stay apart (each part's are numbered after the
    previous part's)."""
    if len(rollouts) == 1:
        return rollouts[0]
    P = max(r.prompt_ids.shape[1] for r in rollouts)
    T = max(r.tokens.shape[1] for r in rollouts)

    def left(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (P - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, value: float = 0) -> torch.Tensor:
        pad = (0, 0, 0, T - x.shape[1]) if x.dim() == 3 else (0, T - x.shape[1])
        return torch.nn.functional.pad(x, pad, value=value)

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=0)

    fulls = [r.full_logprobs for r in rollouts]

    def optional(parts: list[Any], instead: list[torch.Tensor], pad: float = 0) -> Any:
        """None when no part has one, else each part's own or ``instead`` (its neutral)."""
        if all(x is None for x in parts):
            return None
        pairs = zip(parts, instead, strict=True)
        return cat([right(x if x is not None else y, pad) for x, y in pairs])

    return Rollout(
        prompt_ids=cat([left(r.prompt_ids, pad_token_id) for r in rollouts]),
        prompt_mask=cat([left(r.prompt_mask, 0) for r in rollouts]),
        tokens=cat([right(r.tokens, pad_token_id) for r in rollouts]),
        mask=cat([right(r.mask) for r in rollouts]),
        logprobs=cat([right(r.logprobs) for r in rollouts]),
        sample_logprobs=cat([right(r.sample_logprobs) for r in rollouts]),
        values=cat([right(r.values) for r in rollouts]),
        full_logprobs=None if any(f is None for f in fulls) else cat([right(f) for f in fulls]),
        rewards=cat([r.rewards for r in rollouts]),
        # A batch the engine did not sample: its own log-probs, i.e. a ratio of 1.
        engine_logprobs=optional(
            [r.engine_logprobs for r in rollouts], [r.sample_logprobs for r in rollouts]
        ),
        is_weights=optional(
            [r.is_weights for r in rollouts],
            [torch.ones_like(r.sample_logprobs) for r in rollouts],
            pad=1.0,
        ),
        **_episodes(rollouts),
    )


def _episodes(rollouts: list[Rollout]) -> dict[str, torch.Tensor | None]:
    """The episode, turn and paid columns of ``rollouts`` put together (None if none has
    them): a part without them is one-turn episodes, all paid."""
    if all(r.episode is None for r in rollouts):
        return {"episode": None, "turn": None, "paid": None}
    episodes, turns, paid, offset = [], [], [], 0
    for r in rollouts:
        n = len(r.rewards)
        episode = torch.arange(n) if r.episode is None else r.episode
        episodes.append(episode + offset)
        turns.append(torch.zeros(n, dtype=torch.long) if r.turn is None else r.turn)
        paid.append(torch.ones(n, dtype=torch.bool) if r.paid is None else r.paid)
        offset += int(episode.max()) + 1 if n else 0
    return {"episode": torch.cat(episodes), "turn": torch.cat(turns), "paid": torch.cat(paid)}
