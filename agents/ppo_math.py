"""The RL math of token-level PPO (TRL 0.7 style), as small pure torch functions.

Read top to bottom: masked statistics, KL, per-token rewards, GAE, the two PPO
losses, KL coefficient controllers, running score statistics. Tensors are
(B, T) over response tokens with a 0/1 ``mask`` (1 = a real token, 0 = padding;
rows are right-padded to a common length). Nothing here touches a model.
"""

from __future__ import annotations

import math

import torch

# --------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1, so padding never dilutes a statistic.

    Padding entries are replaced by 0 before summing (not multiplied by 0), so a
    non-finite value there, e.g. a -inf log-prob, cannot poison the result.
    An all-zero mask gives NaN, as in TRL.
    """
    mask = mask.to(x.dtype)
    total = torch.where(mask.bool(), x, torch.zeros_like(x))
    if dim is None:
        return (total * mask).sum() / mask.sum()
    return (total * mask).sum(dim=dim) / mask.sum(dim=dim)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over masked entries (Bessel-corrected by default, as in TRL)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("mask sums to zero: no valid entries to take a variance of")
        if n == 1:
            raise ValueError("mask sums to one: the unbiased variance divides by zero")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over masked entries.

    Whitened advantages keep the policy-gradient step size independent of the
    reward scale. With ``shift_mean=False`` only the scale changes: the mean is
    added back (TRL uses this for rewards, where the sign carries meaning).
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# --------------------------------------------------------------------------------------
# Log-probs and entropy from logits (TRL's memory-lean versions)
# --------------------------------------------------------------------------------------


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits) at ``index``, without a second (..., V) tensor (TRL's).

    TRL is imported on first use: its import is slow, and a training script would
    otherwise pay it twice, before and after it relaunches on its allocator.
    """
    from trl.trainer.utils import selective_log_softmax as trl_selective_log_softmax

    return trl_selective_log_softmax(logits, index)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits) over the last dimension, in chunks (TRL's)."""
    from trl.trainer.utils import entropy_from_logits as trl_entropy_from_logits

    return trl_entropy_from_logits(logits)


# --------------------------------------------------------------------------------------
# KL divergence to the reference model
# --------------------------------------------------------------------------------------


def kl_per_token(logprobs_full: torch.Tensor, ref_logprobs_full: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || pi_ref) at each position, summed over the whole vocabulary.

    The exact KL has no sampling noise, unlike the single-sample estimators below;
    CORY's official code penalises this one. Inputs are log-softmax tensors
    (..., V); the result is (...). Tokens with pi = 0 contribute 0 (and no NaN
    gradient) even where their log-prob is -inf. Half precision is upcast to
    float32, since a sum over ~50k terms loses too much in 16 bits.
    """
    logp, logq = logprobs_full, ref_logprobs_full
    if logp.dtype in (torch.float16, torch.bfloat16):
        logp = logp.float()
    if logq.dtype in (torch.float16, torch.bfloat16):
        logq = logq.float()
    p = logp.exp()
    support = p > 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Mask both log-probs off the support of p before subtracting, so that
    # 0 * (-inf) never appears, forwards or backwards.
    diff = torch.where(support, logp, zero) - torch.where(support, logq, zero)
    return (p * diff).sum(dim=-1)


KL_ESTIMATORS = ("k1", "k3", "abs", "mse")


def kl_sampled(
    logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Single-sample estimate of KL(p || q) from the log-probs of the sampled token.

    With x ~ p, logp = log p(x), logq = log q(x):
      - "k1":  logp - logq, unbiased but high variance and can be negative;
      - "k3":  (r - 1) - log r with r = q/p, unbiased, always >= 0, low variance
               (Schulman, "Approximating KL divergence");
      - "abs": |logp - logq|;
      - "mse": 0.5 (logp - logq)^2 (Schulman's k2; biased, low variance).
    """
    if estimator == "k1":
        return logprob - ref_logprob
    if estimator == "k3":
        log_r = ref_logprob - logprob
        return torch.expm1(log_r) - log_r  # (r - 1) - log r, accurate when r ~ 1
    if estimator == "abs":
        return (logprob - ref_logprob).abs()
    if estimator == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {list(KL_ESTIMATORS)}")


# --------------------------------------------------------------------------------------
# Per-token rewards and advantages
# --------------------------------------------------------------------------------------


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last mask==1 position of each row of a (B, T) mask; errors on empty rows."""
    valid = mask.bool()
    empty = ~valid.any(dim=-1)
    if empty.any():
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"mask rows {rows} have no valid token to receive the score")
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(valid)
    return torch.where(valid, positions, -1).amax(dim=-1)


def token_rewards(
    score: torch.Tensor,
    kl: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense per-token reward: a KL penalty at every token, the task score at the end.

    The KL penalty keeps the policy near the reference model token by token; the
    sparse task ``score`` (B,) is credited to the last real token of each row,
    where the episode ends. ``kl`` and ``mask`` are (B, T). Returns
    ``(rewards, non_score_reward)``, both (B, T) and zero on padding.
    """
    valid = mask.bool()
    non_score_reward = torch.where(valid, -kl_coef * kl, torch.zeros_like(kl))
    last = last_valid_index(mask)
    rows = torch.arange(kl.shape[0], device=kl.device)
    rewards = non_score_reward.clone()
    rewards[rows, last] += score.to(rewards.dtype)
    return rewards, non_score_reward


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    gae_lambda: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over right-padded (B, T) rows.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * gae_lambda * A_{t+1},
    run backwards. gae_lambda trades bias (0: one-step TD) against variance
    (1: Monte Carlo). The value after the last valid token is 0 because the
    episode ends there; padding is zeroed so it contributes nothing. Returns
    ``(advantages, returns)`` with returns = advantages + values (the value
    targets), both detached and zero on padding. Advantages are not whitened.
    """
    valid = mask.bool()
    zeros = torch.zeros_like(values)
    values = torch.where(valid, values.detach(), zeros)
    rewards = torch.where(valid, rewards.detach(), zeros)
    T = rewards.shape[-1]
    last_gae = torch.zeros_like(values[:, 0])
    advantages_reversed = []
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t < T - 1 else torch.zeros_like(last_gae)
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = delta + gamma * gae_lambda * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    advantages = torch.where(valid, advantages, zeros)
    returns = advantages + values
    return advantages, returns


# --------------------------------------------------------------------------------------
# PPO losses
# --------------------------------------------------------------------------------------


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float = 0.2,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate, averaged over valid tokens; with ``weights`` (B, T) each
    token's term is multiplied by its weight first (a rollout engine's off-policy
    correction, ``agents/engine_correction.py``).

    Taking the max of the unclipped and clipped losses is the pessimistic bound:
    the policy gains nothing from moving the ratio exp(logp - old) outside
    [1 - clip, 1 + clip] in the direction the advantage favours. Returns the loss
    and detached stats: ``approx_kl`` = 0.5 mean((logp - old)^2), ``clipfrac``, the
    fraction of tokens where the clipped branch was taken, and ``ratio``, its mean.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    per_token = torch.max(losses_unclipped, losses_clipped)
    loss = masked_mean(per_token if weights is None else per_token * weights, mask)
    with torch.no_grad():
        clipped = (losses_clipped > losses_unclipped).to(losses_clipped.dtype)
        stats = {
            **ratio_stats(logprobs, old_logprobs, mask),
            "clipfrac": masked_mean(clipped, mask),
        }
    return loss, stats


@torch.no_grad()
def ratio_stats(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the update has moved the policy from the one that acted, per valid token:
    ``approx_kl`` = 0.5 mean((logp - old)^2) (TRL 0.7's) and ``ratio`` = mean exp(logp - old).
    Every learner reports them, whatever its loss, so update health reads alike."""
    log_ratio = (logprobs - old_logprobs).detach()
    return {
        "approx_kl": 0.5 * masked_mean(log_ratio**2, mask),
        "ratio": masked_mean(torch.exp(log_ratio), mask),
    }


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's clipped value loss, 0.5 * mean(max((v - R)^2, (clip(v) - R)^2)).

    ``clip(v)`` keeps the new prediction within ``clip_range_value`` of the
    rollout-time value ``old_values``, so one update cannot move the critic far;
    the max makes it pessimistic like the policy loss. Returns the loss and
    detached stats: ``vf_clipfrac``, the fraction of tokens where the clipped
    branch was taken.
    """
    values_clipped = torch.clamp(
        values, old_values - clip_range_value, old_values + clip_range_value
    )
    losses_unclipped = (values - returns) ** 2
    losses_clipped = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(losses_unclipped, losses_clipped), mask)
    with torch.no_grad():
        clipped = (losses_clipped > losses_unclipped).to(losses_clipped.dtype)
        stats = {"vf_clipfrac": masked_mean(clipped, mask)}
    return loss, stats


# --------------------------------------------------------------------------------------
# KL coefficient controllers
# --------------------------------------------------------------------------------------


class AdaptiveKLController:
    """Adapts the KL coefficient to hold the observed KL near a target (Ziegler et al. 2019).

    proportional_error = clip(current / target - 1, -0.2, 0.2);
    value *= 1 + proportional_error * n_steps / horizon. The clip bounds how fast
    the coefficient may move however far the KL strays.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got {target=}, {horizon=}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        mult = 1.0 + proportional_error * n_steps / self.horizon
        self.value *= mult

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))


class FixedKLController:
    """A constant KL coefficient; ``update`` is a no-op so callers need not special-case it."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


# --------------------------------------------------------------------------------------
# Running score statistics
# --------------------------------------------------------------------------------------


def _batch_mean_var_count(xs: torch.Tensor) -> tuple[float, float, float]:
    """Mean, population variance and count of ``xs``, across all ranks if torch.distributed runs.

    Like TRL's ``get_global_statistics``: every rank must call it together.
    """
    xs = xs.detach().float()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        sum_count = torch.stack([xs.sum(), torch.tensor(float(xs.numel()), device=xs.device)])
        torch.distributed.all_reduce(sum_count)
        total, count = sum_count.tolist()
        mean = total / count
        sq = ((xs - mean) ** 2).sum()
        torch.distributed.all_reduce(sq)
        return mean, sq.item() / count, count
    var, mean = torch.var_mean(xs, unbiased=False)
    return mean.item(), var.item(), float(xs.numel())


class RunningMoments:
    """Running mean and std of every value seen, merged batch by batch (Chan et al.).

    Used to scale task scores so the reward scale stays stable as the policy
    improves. ``var`` is the population variance over all values so far, ``std``
    its Bessel-corrected square root (as in TRL). Starts at mean 0, std 1,
    count 1e-24 so the first batch simply replaces the prior.
    """

    def __init__(self) -> None:
        self.mean: float = 0.0
        self.std: float = 1.0
        self.var: float = 1.0
        self.count: float = 1e-24

    @torch.no_grad()
    def update(self, xs: torch.Tensor) -> tuple[float, float]:
        """Merge a batch in; return that batch's mean and (unbiased) std."""
        xs_mean, xs_var, xs_count = _batch_mean_var_count(xs)
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        new_sum = xs_var * xs_count
        # The old sum of squares, corrected for the shift of the mean.
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / tot_count
        self.mean += delta * xs_count / tot_count
        self.var = (old_sum + new_sum) / tot_count
        self.std = math.sqrt(self.var * tot_count / (tot_count - 1))
        self.count = tot_count
        batch_std = math.sqrt(xs_var * xs_count / (xs_count - 1)) if xs_count > 1 else math.nan
        return xs_mean, batch_std

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "std": self.std, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean = float(state["mean"])
        self.std = float(state["std"])
        self.var = float(state["var"])
        self.count = float(state["count"])


def scale_scores(
    scores: torch.Tensor,
    moments: RunningMoments | None,
    use_scaling: bool = True,
    use_normalization: bool = True,
    clip: float | None = None,
) -> torch.Tensor:
    """Rescale task scores with running statistics, as TRL 0.7's PPOTrainer.step does.

    ``use_scaling`` (TRL ``use_score_scaling``): update ``moments`` with this
    batch, then divide by the running std; ``use_normalization``
    (``use_score_norm``) also subtracts the running mean, and like TRL it has
    no effect without scaling. ``clip`` (``score_clip``) then clamps to
    [-clip, clip], whether or not scaling is on.
    """
    if use_scaling:
        if moments is None:
            raise ValueError("use_scaling=True needs a RunningMoments instance")
        moments.update(scores)
        scale = moments.std + torch.finfo(scores.dtype).eps
        if use_normalization:
            scores = (scores - moments.mean) / scale
        else:
            scores = scores / scale
    if clip is not None:
        scores = torch.clamp(scores.float(), -clip, clip).to(scores.dtype)
    return scores
