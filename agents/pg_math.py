"""The math of the critic-free baselines (REINFORCE, RLOO, GRPO) as small pure torch functions.

Kept apart from ``agents/ppo_math.py`` (PPO's terms) so that each learner's formulas can be
read, and checked against hand-computed values, on their own. Token tensors are (B, T)
with a 0/1 ``mask`` (rows right-padded); group tensors are (B,) with the k answers to one
query in consecutive rows ``[g*k, (g+1)*k)``. Nothing here touches a model.
"""

from __future__ import annotations

import torch

from cory_rl.agents.ppo_math import masked_var

# --------------------------------------------------------------------------------------
# REINFORCE: returns-to-go and baselines
# --------------------------------------------------------------------------------------


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = sum_{s >= t} gamma^(s-t) r_s over each row's valid tokens; 0 on padding.

    Each token is credited only with the rewards that come at or after it (causality), which
    removes the variance of the rewards it could not have influenced.
    """
    valid = mask.bool()
    r = torch.where(valid, rewards.detach(), torch.zeros_like(rewards))
    running = torch.zeros_like(r[:, 0])
    out = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(valid, out, torch.zeros_like(out))


class RunningMean:
    """An exponential moving average of past batches' mean return, as a REINFORCE baseline.

    ``value`` is None until the first :meth:`update`; after it,
    ``value = decay * value + (1 - decay) * batch_mean``. A batch is scored against the
    baseline of the batches *before* it, so the baseline does not depend on its own samples.
    """

    def __init__(self, decay: float) -> None:
        self.decay = float(decay)
        self.value: float | None = None

    def update(self, batch_mean: float) -> None:
        if self.value is None:
            self.value = float(batch_mean)
        else:
            self.value = self.decay * self.value + (1.0 - self.decay) * float(batch_mean)

    def state_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "decay": self.decay}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        value = state["value"]
        self.value = None if value is None else float(value)
        self.decay = float(state.get("decay", self.decay))


def scale_only(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` divided by its masked std (its mean is kept, so a running baseline still counts)."""
    return x * torch.rsqrt(masked_var(x, mask) + 1e-8)


# --------------------------------------------------------------------------------------
# Group baselines: k answers to one query
# --------------------------------------------------------------------------------------


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one per answer, shape (B,), got {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"a group baseline needs group_size >= 2, got {group_size}")
    if len(rewards) % group_size:
        raise ValueError(
            f"{len(rewards)} answers do not split into groups of {group_size} (rows "
            "[g*k, (g+1)*k) must share query g)"
        )
    return rewards.view(-1, group_size)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out: A_i = R_i - mean_{j != i} R_j over the i-th answer's group.

    The baseline of each answer uses only the *other* answers to the same query, so it is
    independent of the answer itself and the gradient estimate stays unbiased.
    """
    grouped = _groups(rewards, group_size)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).reshape(-1)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """Group-normalised: A_i = (R_i - mean(R_group)) / (std + eps), std Bessel-corrected.

    ``scale``: ``group`` divides by the std of the answer's group (GRPO), ``batch`` by the
    std of the whole batch, ``none`` not at all (Dr. GRPO); as TRL's ``scale_rewards``.
    """
    grouped = _groups(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (rewards.std() + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return centred.reshape(-1)


def grpo_scale(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """(B,) what :func:`grpo_advantages` multiplies each answer's centred reward by: 1 / (std
    + eps) of its group or of the batch, or 1 (``scale: none``)."""
    grouped = _groups(rewards, group_size)
    if scale == "group":
        factor = 1.0 / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        factor = torch.full_like(grouped[:, :1], 1.0) / (rewards.std() + eps)
    elif scale == "none":
        factor = torch.ones_like(grouped[:, :1])
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return factor.expand_as(grouped).reshape(-1)


def normalize(x: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(x - mean) / (std + eps) over the batch (TRL's RLOO ``normalize_advantages``)."""
    return (x - x.mean()) / (x.std() + eps)


# --------------------------------------------------------------------------------------
# The clipped surrogate's variants (TRL 1.x's GRPO: loss_type, epsilon_high, GSPO)
# --------------------------------------------------------------------------------------

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def importance_log_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log(pi / pi_old) per token (B, T), or per answer (B, 1) as the mean over its valid
    tokens (GSPO, Zheng et al. 2025: a sequence ratio that does not grow with length)."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    if level == "sequence":
        valid = mask.to(log_ratio.dtype)
        total = torch.where(valid.bool(), log_ratio, torch.zeros_like(log_ratio)).sum(-1)
        return (total / valid.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")


def clipped_surrogate(
    log_weights: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-min(w A, clip(w, 1 - eps_low, 1 + eps_high) A) with w = exp(log_weights), and where
    the clip binds: below (w < 1 - eps_low with A < 0) and above (w > 1 + eps_high, A > 0).

    A larger ``epsilon_high`` (DAPO's clip-higher, 0.28) lets rare tokens of good answers
    gain probability faster, against the entropy collapse of a symmetric clip. Shapes
    broadcast: (B, T) or (B, 1) weights against (B, 1) advantages."""
    w = torch.exp(log_weights)
    clipped = torch.clamp(w, 1.0 - epsilon_low, 1.0 + epsilon_high)
    loss = -torch.min(w * advantages, clipped * advantages)
    with torch.no_grad():
        low = (w < 1.0 - epsilon_low) & (advantages < 0)
        high = (w > 1.0 + epsilon_high) & (advantages > 0)
    return loss, low, high


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_length: int | None = None,
    mean_length: float | None = None,
) -> torch.Tensor:
    """A (B, T) per-token loss reduced as TRL's ``loss_type`` says, over the rows given.

    - ``grpo``: each answer's token mean, then the mean over answers (a long answer's
      tokens count less);
    - ``bnpo``: the mean over the rows' valid tokens;
    - ``dr_grpo``: the sum over valid tokens divided by rows x ``max_length`` (Liu et al.
      2025: no length bias; TRL's ``max_completion_length``);
    - ``dapo``: each answer's token sum divided by ``mean_length``, the mean answer length
      of the whole batch, then the mean over answers: the sum over a mini-batch's tokens
      divided by the batch's tokens per mini-batch (TRL's ``num_items_in_batch``).

    Every reduction but ``bnpo`` is a mean over rows, so chunks of a mini-batch weighted by
    their rows add up to it (``agents/update.py``'s ``unit="answer"``)."""
    valid = mask.to(per_token.dtype)
    masked = torch.where(valid.bool(), per_token, torch.zeros_like(per_token))
    if loss_type == "bnpo":
        return masked.sum() / valid.sum().clamp(min=1.0)
    sums = masked.sum(-1)
    if loss_type == "grpo":
        return (sums / valid.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        if not max_length:
            raise ValueError("dr_grpo needs max_length, the longest answer the game allows")
        return sums.mean() / max_length
    if loss_type == "dapo":
        if mean_length is None:
            raise ValueError("dapo needs mean_length, the batch's mean answer length")
        return sums.mean() / max(float(mean_length), 1e-8)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def truncated_rows(tokens: torch.Tensor, mask: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """(B,) True where an answer stopped without EOS (its budget or the context ran out):
    TRL's ``mask_truncated_completions`` leaves those out of the loss, since the reward of
    a cut-off answer says little about the tokens it has."""
    lengths = mask.long().sum(-1)
    last = tokens.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return (lengths == 0) | (last != eos_token_id)
