"""Off-policy correction for tokens a rollout engine sampled (TRL's vLLM importance sampling).

An engine (vLLM) samples a turn; the learner then recomputes its own log-probs of those
tokens, and its update treats them as drawn from its own policy. They were drawn from the
engine's, which drifts from the learner's (other kernels, precision, a stale weight): each
token is therefore weighted by the importance ratio ``exp(learner_logp - engine_logp)``
between the learner's log-prob at acting time (``sample_logprobs``) and the engine's,
truncated or masked so that a rare large ratio cannot blow the update up (truncated IS,
Yao et al. 2025; TRL 1.16's ``vllm_importance_sampling_*`` settings, whose four modes
these are):

- ``token_truncate``: each token's ratio clipped to ``[floor, cap]``;
- ``token_mask``: a token whose ratio is outside ``[floor, cap]`` gets weight 0;
- ``sequence_truncate``: one ratio per answer (the product of its tokens'), clipped, on
  each of its tokens;
- ``sequence_mask``: an answer whose ratio is outside ``[floor, cap]`` leaves the loss.

The weights go into the batch data under :data:`WEIGHTS`; a loss multiplies its per-token
policy term by them (:func:`weighted`), or a per-answer term by its answer's mean weight
(:func:`weighted_answers`). Without an engine there is no such entry and every loss
computes exactly what it computed before. Nothing here touches a model.
"""

from __future__ import annotations

import math

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
WEIGHTS = "is_weights"
"""The batch-data key of the (B, T) correction weights, present only when an engine sampled."""


def correction_weights(
    learner_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_truncate",
    cap: float | None = 3.0,
    floor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) weights (1 on padding) and their statistics over the valid units (tokens,
    or answers in the sequence modes): the raw ratio's mean, min and max, the applied
    weights' mean and the fraction of units truncated or masked.

    An engine log-prob that is NaN (none given) counts as equal to the learner's: weight 1,
    as TRL does."""
    if mode not in MODES:
        raise ValueError(f"engine correction mode must be one of {MODES}, got {mode!r}")
    valid = mask.bool()
    diff = torch.nan_to_num(learner_logprobs.float() - engine_logprobs.float(), nan=0.0)
    diff = torch.where(valid, diff, torch.zeros_like(diff))
    if mode.startswith("sequence"):
        ratio = torch.exp(diff.sum(dim=-1, keepdim=True))  # (B, 1)
        units = valid.any(dim=-1, keepdim=True)
    else:
        ratio = torch.exp(diff)
        units = valid
    low = -math.inf if floor is None else floor
    high = math.inf if cap is None else cap
    outside = (ratio < low) | (ratio > high)
    if mode.endswith("truncate"):
        unit_weights = ratio if cap is None and floor is None else ratio.clamp(floor, cap)
    else:
        unit_weights = torch.where(outside, torch.zeros_like(ratio), ratio)
    weights = torch.where(valid, unit_weights.expand_as(diff), torch.ones_like(diff))
    if not units.any():
        return weights, {}
    raw = ratio[units]
    return weights, {
        "engine/is_ratio_mean": float(raw.mean()),
        "engine/is_ratio_min": float(raw.min()),
        "engine/is_ratio_max": float(raw.max()),
        "engine/is_weight_mean": float(unit_weights[units].mean()),
        "engine/is_clipped_frac": float(outside[units].float().mean()),
    }


def weighted(per_token: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """A per-token policy term times the engine correction's weights; the very same tensor
    when no engine sampled. A (B, 1) term (one ratio per answer) broadcasts to (B, T)."""
    weights = mb.get(WEIGHTS)
    return per_token if weights is None else per_token * weights


def weighted_answers(
    per_answer: torch.Tensor, mb: dict[str, torch.Tensor], mask: torch.Tensor
) -> torch.Tensor:
    """A (B, 1) per-answer term times its answer's mean weight over ``mask``'s tokens.

    An answer's loss spread evenly over its tokens, each share weighted by its token's
    weight, is the loss times the mean weight; in the sequence modes every token of an
    answer carries the answer's weight, so this is that weight exactly. An answer with no
    token in ``mask`` keeps weight 1. The very same tensor when no engine sampled."""
    weights = mb.get(WEIGHTS)
    if weights is None:
        return per_answer
    valid = mask.to(weights.dtype)
    count = valid.sum(dim=-1, keepdim=True)
    total = torch.where(valid.bool(), weights, torch.zeros_like(weights)).sum(-1, keepdim=True)
    mean = torch.where(count > 0, total / count.clamp(min=1.0), torch.ones_like(total))
    return per_answer * mean
