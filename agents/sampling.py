"""The distribution a token is drawn from, so that PPO's ratio compares that same distribution.

Sampling may reshape the model's distribution: a repetition penalty (the official CORY
scripts use 1.1), a temperature, top-k or top-p. The token's recorded log-probability is
taken under the reshaped distribution it was actually drawn from, and ``learn`` reshapes
the new logits the same way, so the PPO ratio starts at exactly 1. (TRL 0.7's PPOTrainer,
which the official code calls, recomputes the old log-probs with a plain forward pass: the
model's own distribution, not the penalised one it sampled from.) The KL to the reference
is always that of the model's own distribution.
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def seen_before_each(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens seen before each of the T response positions: ids (N, T, P+T), the prompt
    then the earlier response tokens, and which of those slots are real (N, T, P+T) bool.

    A few dozen ids per position instead of a (N, T, V) mask: the repetition penalty then
    touches only the logits it changes."""
    N, T = tokens.shape
    P = prompt_ids.shape[1]
    earlier = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril(-1)
    ids = torch.cat(
        [prompt_ids[:, None, :].expand(N, T, P), tokens[:, None, :].expand(N, T, T)], -1
    )
    real = torch.cat(
        [prompt_mask.bool()[:, None, :].expand(N, T, P), earlier.expand(N, T, T)], dim=-1
    )
    return ids, real


class SamplingDistribution:
    """Repetition penalty (Keskar et al. 2019, as in transformers), temperature, top-k, top-p."""

    def __init__(
        self,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
    ) -> None:
        self.repetition_penalty = repetition_penalty
        warpers = []
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k > 0:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)

    @property
    def is_model(self) -> bool:
        """True when tokens are drawn from the model's own distribution."""
        return self.repetition_penalty == 1.0 and not self.warpers

    @property
    def needs_history(self) -> bool:
        return self.repetition_penalty != 1.0

    def logits(
        self, logits: torch.Tensor, seen: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """Reshape (..., V) logits; ``seen`` = (ids, real) (..., K) names the tokens already
        in the context (slots where ``real`` is False are ignored)."""
        if self.repetition_penalty != 1.0:
            if seen is None:
                raise ValueError("a repetition penalty needs the tokens seen so far")
            logits = self._penalise(logits, *seen)
        if self.warpers:
            shape = logits.shape
            logits = self.warpers(None, logits.reshape(-1, shape[-1]).clone()).reshape(shape)
        return logits

    def _penalise(
        self, logits: torch.Tensor, ids: torch.Tensor, real: torch.Tensor
    ) -> torch.Tensor:
        """transformers' rule, x * p where x < 0 and x / p elsewhere, on the seen tokens.

        As ``logits * up / down`` with factors that are p on the tokens to change and 1
        elsewhere: the same bits as that rule (x * 1 and x / 1 are exact), the same
        gradient, and a token seen twice is changed once. The factors are scattered
        from the K seen ids with max (min for p < 1), so that ignored slots, which write
        1, never undo a real one."""
        p = self.repetition_penalty
        picked = logits.detach().gather(-1, ids)
        reduce = "amax" if p > 1 else "amin"
        factors = []
        for change in (real & (picked < 0), real & (picked >= 0)):
            values = torch.where(change, p, 1.0).to(logits.dtype)
            factors.append(torch.ones_like(logits).scatter_reduce_(-1, ids, values, reduce))
        up, down = factors
        return logits * up / down
