"""REINFORCE with a baseline and PPO's per-token KL penalty, no critic (a rebuttal baseline).

``learn`` does, top to bottom:

1. the KL to the frozen reference per token, exactly as PPO computes it (the exact
   full-vocabulary KL, or the sampled estimator ``kl_estimator`` names);
2. per-token rewards ``r_t = -kl_coef * KL_t``, the task score (scaled as PPO's
   ``score_scaling``/``score_norm``/``score_clip`` say) added at the last token, ``kl_coef``
   from PPO's adaptive or fixed KL controller;
3. returns-to-go ``G_t = sum_{s>=t} gamma^(s-t) r_s`` and a baseline ``b`` (``baseline``);
4. one gradient pass over shuffled mini-batches (gradient accumulation as PPO's settings
   say) of ``loss = -mean over valid tokens of logprob_t * (G_t - b)``;
5. the KL controller update from the batch's mean summed KL, as PPO.

``logprob_t`` is taken under the distribution the token was sampled from (PPOAgent's rule,
agents/sampling.py: the model's own unless a repetition penalty, temperature, top-k or top-p
reshapes it). With ``whiten_advantages`` (PPO's setting) ``G_t - b`` is divided by its std
over the batch (scale only: the baseline keeps its meaning). PPO settings with no meaning
here: ``ppo_epochs`` (one pass), ``gae_lambda``, ``clip_range``, ``clip_range_value``,
``vf_coef``, ``ratio_threshold``.

:class:`CriticFreeAgent` is the part RLOO and GRPO (``agents/group.py``) share: PPOAgent's
acting, reference KL, KL control and persistence, with the value head frozen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import pg_math as pg
from agents import ppo_math as pm
from agents import state_io
from agents.policy import PolicyWithValue, Reference
from agents.ppo import PPOAgent, PPOConfig, Rollout, response_logits
from agents.registry import Seat, register_learner
from cory_env import checks

BASELINES = ("batch_mean", "running_mean", "none")

LossFn = Callable[
    [dict[str, torch.Tensor], torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]
]
"""``(micro_batch, logprobs, own_logprobs) -> (mean loss over the micro-batch's units, stats)``:
each response token's log-prob under the distribution it was sampled from, and under the
model's own distribution (the same unless sampling reshapes it; see agents/sampling.py)."""


@dataclass
class ReinforceConfig(PPOConfig):
    """PPO's settings (acting, KL penalty and controller, score scaling, mini-batches) + a baseline.

    ``baseline`` defaults to ``batch_mean``: the mean return-to-go over the batch's valid
    tokens. It follows the reward level at once as the policy improves (a running mean lags
    behind it, and starts from nothing), needs no state, and with score scaling off (the
    baselines' default) the task score can sit far from 0, where no baseline would leave a
    large, high-variance offset. Its own-sample bias is O(1/tokens per batch).
    ``running_mean``: an exponential moving average (``baseline_decay``) of earlier batches'
    means; ``none``: b = 0.
    """

    baseline: str = "batch_mean"
    baseline_decay: float = 0.9
    """Weight of the old value in the ``running_mean`` baseline's update."""

    def validate(self) -> None:
        super().validate()
        checks.choice(self.baseline, "baseline", BASELINES, where="reinforce")
        self.baseline_decay = checks.number(
            self.baseline_decay, "baseline_decay", minimum=0, maximum=1, where="reinforce"
        )


class CriticFreeAgent(PPOAgent):
    """PPOAgent's acting, reference KL, KL control and persistence, without the critic.

    The value head stays in the model (acting computes it, checkpoints keep it) but is
    frozen: no loss uses it, so it never moves. Without LoRA it is also out of the
    optimiser; with LoRA ``PolicyWithValue.trainable_parameters`` lists it regardless, and it
    sits there with no gradient, so Adam neither keeps state for it nor updates it.
    """

    def __init__(
        self,
        policy: PolicyWithValue,
        reference: Reference,
        config: PPOConfig,
        pad_token_id: int,
        accelerator: Any = None,
        seed: int = 0,
    ) -> None:
        policy.value_head.requires_grad_(False)
        super().__init__(policy, reference, config, pad_token_id, accelerator, seed)

    @staticmethod
    def batch_tensors(rollout: Rollout) -> dict[str, torch.Tensor]:
        """What every mini-batch forward needs, built once; mini-batches are rows of them."""
        ids, attention, positions = rollout.sequences()
        return {
            "ids": ids, "attention": attention, "positions": positions,
            "tokens": rollout.tokens, "prompt_ids": rollout.prompt_ids,
            "prompt_mask": rollout.prompt_mask, "old_logprobs": rollout.sample_logprobs,
            "mask": rollout.mask.float(),
        }  # fmt: skip

    def gradient_pass(
        self, data: dict[str, torch.Tensor], epochs: int, loss_fn: LossFn, per_token: bool
    ) -> dict[str, float]:
        """``epochs`` passes over shuffled mini-batches; one optimiser step per mini-batch.

        Each micro-batch's mean loss is weighted by its share of the mini-batch's units
        (valid tokens if ``per_token``, else rows), so accumulating the micro-batches gives
        exactly the mean over the whole mini-batch however it is split.
        """
        cfg = self.config
        B, T = data["tokens"].shape
        micro = cfg.mini_batch_size // cfg.gradient_accumulation_steps
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(epochs):
            order = torch.randperm(B, generator=self.shuffle_generator)
            for batch in order.split(cfg.mini_batch_size):
                total = float(data["mask"][batch].sum()) if per_token else len(batch)
                self.optimizer.zero_grad(set_to_none=True)
                for rows in batch.split(micro):
                    mb = self.rows_on_device(data, rows, T)
                    with self.accelerator.autocast():
                        logits, _, _ = self.policy(
                            mb["ids"], mb["attention"], mb["positions"], keep=T + 1
                        )
                    logits = response_logits(logits, T)
                    own = pm.selective_log_softmax(logits, mb["tokens"])
                    sampled = own if self.sampling.is_model else self.sampled_logprobs(logits, mb)
                    loss, step_stats = loss_fn(mb, sampled, own)
                    units = float(mb["mask"].sum()) if per_token else len(rows)
                    self.accelerator.backward(loss * (units / total))
                    with torch.no_grad():
                        entropy = pm.entropy_from_logits(logits.detach())
                    step_stats = {"loss": loss, **step_stats,
                                  "entropy": pm.masked_mean(entropy, mb["mask"])}  # fmt: skip
                    for k, v in step_stats.items():
                        stats[f"{self.name}/{k}"].append(float(torch.as_tensor(v).detach()))
                if cfg.max_grad_norm is not None:
                    norm = self.accelerator.clip_grad_norm_(
                        self.model.trainable_parameters(), cfg.max_grad_norm
                    )
                    stats[f"{self.name}/grad_norm"].append(float(norm))
                self.optimizer.step()
        return {k: float(np.mean(v)) for k, v in stats.items()}


class ReinforceAgent(CriticFreeAgent):
    """REINFORCE: logprob_t * (G_t - b), one gradient pass per rollout (see the module doc)."""

    name = "reinforce"

    def __init__(
        self,
        policy: PolicyWithValue,
        reference: Reference,
        config: ReinforceConfig,
        pad_token_id: int,
        accelerator: Any = None,
        seed: int = 0,
    ) -> None:
        super().__init__(policy, reference, config, pad_token_id, accelerator, seed)
        self.running = pg.RunningMean(config.baseline_decay)

    def baseline(self, returns: torch.Tensor, mask: torch.Tensor) -> float:
        """b for this batch, as ``config.baseline`` says (the running mean then moves on)."""
        if self.config.baseline == "none":
            return 0.0
        batch_mean = float(pm.masked_mean(returns, mask))
        if self.config.baseline == "batch_mean":
            return batch_mean
        b = batch_mean if self.running.value is None else self.running.value
        self.running.update(batch_mean)
        return b

    def learn(self) -> dict[str, float]:
        """One REINFORCE update on the rollout collected since the last call."""
        cfg, ro = self.config, self.take_rollout()
        mask = ro.mask.float()
        kl = self.reference_kl(ro)
        scores = self.scaled_scores(ro)
        kl_coef = float(self.kl_ctl.value)
        rewards, non_score = pm.token_rewards(scores, kl, mask, kl_coef)
        returns = pg.returns_to_go(rewards, mask, cfg.gamma)
        b = self.baseline(returns, mask)
        advantages = (returns - b) * mask
        if cfg.whiten_advantages:
            advantages = pg.scale_only(advantages, mask) * mask
        data = {**self.batch_tensors(ro), "advantages": advantages}

        def loss_fn(mb: dict, logprobs: torch.Tensor, own: torch.Tensor) -> tuple[Any, dict]:
            return -pm.masked_mean(logprobs * mb["advantages"], mb["mask"]), {}

        stats = self.gradient_pass(data, 1, loss_fn, per_token=True)
        return {
            **stats,
            **self.finish(ro, kl, kl_coef, scores),
            "objective/non_score_reward": float(non_score.sum(dim=1).mean()),
            "reinforce/returns_mean": float(pm.masked_mean(returns, mask)),
            "reinforce/baseline": b,
        }

    def save(self, path: Path) -> None:
        """PPOAgent's files, plus the running baseline in ``reinforce.json``."""
        super().save(path)
        state_io.save_json({"baseline": self.running.state_dict()}, Path(path) / "reinforce.json")

    def load(self, path: Path) -> None:
        super().load(path)
        file = Path(path) / "reinforce.json"
        meta = state_io.require(state_io.load_json(file), ("baseline",), file)
        try:
            self.running.load_state_dict(meta["baseline"])
        except (KeyError, TypeError, ValueError) as err:
            raise state_io.invalid(file, f"inconsistent baseline state: {err!r}") from None


@register_learner("reinforce", config=ReinforceConfig)
def make_reinforce_agent(seat: Seat) -> ReinforceAgent:
    """REINFORCE with a baseline and PPO's per-token KL penalty, no critic."""
    policy, reference = seat.models.policy(seat.model, seat.agent)
    return ReinforceAgent(
        policy, reference, seat.settings, seat.pad_token_id, seat.accelerator, seed=seat.seed
    )
