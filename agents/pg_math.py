"""The math of the critic-free baselines (REINFORCE, RLOO, GRPO) as small pure torch functions.

Kept apart from ``agents/ppo_math.py`` (PPO's terms) so that each learner's formulas can be
read, and checked against hand-computed values, on their own. Token tensors are (B, T)
with a 0/1 ``mask`` (rows right-padded); group tensors are (B,) with the k answers to one
query in consecutive rows ``[g*k, (g+1)*k)``. Nothing here touches a model.
"""

from __future__ import annotations

import torch

from agents.ppo_math import masked_var

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


def normalize(x: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(x - mean) / (std + eps) over the batch (TRL's RLOO ``normalize_advantages``)."""
    return (x - x.mean()) / (x.std() + eps)
