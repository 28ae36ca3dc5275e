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


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(N, V) bool: which tokens occur among the unmasked ``ids`` (N, L) of each row."""
    counts = torch.zeros(ids.shape[0], vocab_size, device=ids.device)
    counts.scatter_add_(1, ids, mask.to(counts.dtype))
    return counts > 0


def seen_before_each(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """(N, T, V) bool: the tokens seen before each response position (prompt + earlier ones)."""
    prompt = seen_tokens(prompt_ids, prompt_mask, vocab_size)
    onehot = torch.zeros(*tokens.shape, vocab_size, device=tokens.device)
    onehot.scatter_(2, tokens[..., None], 1.0)
    earlier = torch.cat([torch.zeros_like(onehot[:, :1]), onehot[:, :-1]], dim=1).cumsum(1) > 0
    return earlier | prompt[:, None, :]


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

    def logits(self, logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """Reshape (..., V) logits; ``seen`` (..., V) marks tokens already in the context."""
        if self.repetition_penalty != 1.0:
            if seen is None:
                raise ValueError("a repetition penalty needs the tokens seen so far")
            p = self.repetition_penalty
            penalised = torch.where(logits < 0, logits * p, logits / p)
            logits = torch.where(seen, penalised, logits)
        if self.warpers:
            shape = logits.shape
            logits = self.warpers(None, logits.reshape(-1, shape[-1]).clone()).reshape(shape)
        return logits
