"""RLOO and GRPO: critic-free learners whose baseline is the other answers to the same query.

The game plays each query k = ``group_size`` times in consecutive rows (rows
``[g*k, (g+1)*k)`` share query g), so the k answers' rewards give each answer a baseline
with no value model. Both follow TRL's current trainers (``trl/trainer/rloo_trainer.py``
and ``grpo_trainer.py`` at 1.10.0.dev0). Settings: ``clip_range`` = TRL's ``epsilon``
(0.2), ``ppo_epochs`` = ``num_iterations`` (mu; TRL's default is 1), the KL coefficient
``beta`` = ``init_kl_coef`` under the adaptive or fixed controller (TRL's is fixed:
``adaptive_kl: false``; its defaults are 0.05 for RLOO and 0.0 for GRPO), one optimiser
step per mini-batch (TRL's default: one per generation batch, i.e. ``mini_batch_size`` =
``batch_size``), game rewards scaled as the ``score_*`` settings say (TRL: raw). The
ratio's log-probs are those of the distribution the tokens were sampled from, the old ones
recorded while acting, as every LLM learner takes them (TRL: the model's logits divided by
the temperature); the KL is always the model's own distribution's. Acting, the reference
pass, KL control and persistence are the LLM learner base's (``agents/llm.py``); the
update is ``agents/update.py``'s.

- **RLOO** (Ahmadian et al. 2024): KL enters the *reward*. R_i = score_i - beta * sum_t KL_t
  (TRL: the k1 estimate ``logp_old - logp_ref``, i.e. ``kl_estimator: k1``; here the KL PPO
  computes, by default the exact one), A_i = R_i - mean_{j != i} R_j, optionally normalised
  over the batch ((A - mean) / (std + 1e-4): TRL's ``normalize_advantages``, default off;
  here PPO's ``whiten_advantages``). Loss: a clipped ratio of *sequence* probabilities,
  rho_i = exp(sum_t logp_t - sum_t logp_old_t), -min(rho A, clip(rho, 1-eps, 1+eps) A),
  mean over answers.
- **GRPO** (Shao et al. 2024): KL enters the *loss*. A_i = (score_i - mean(group)) /
  (std(group) + 1e-4) (``scale_rewards``: group / batch / none, as TRL); per token
  -min(r_t A, clip(r_t) A) + beta * k3_t with r_t = exp(logp_t - logp_old_t) and
  k3_t = exp(logp_ref - logp) - (logp_ref - logp) - 1 on the current policy (so it has a
  gradient), summed over the mini-batch's valid tokens and divided by their number (TRL's
  default ``loss_type="dapo"``). ``whiten_advantages`` does not apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agents import pg_math as pg
from agents import ppo_math as pm
from agents.llm import LLMConfig, LLMLearner
from agents.policy import PolicyWithValue, Reference
from agents.registry import Seat, register_learner
from agents.update import minibatch_update
from cory_env import checks

SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class RLOOConfig(LLMConfig):
    """The shared LLM settings plus the clipped ratio's epochs and range."""

    ppo_epochs: int = 4
    """Passes over each batch (TRL's ``num_iterations``, mu)."""
    clip_range: float = 0.2
    """TRL's ``epsilon``."""

    where = "rloo"

    def validate(self) -> None:
        super().validate()
        w = self.where
        checks.integer(self.ppo_epochs, "ppo_epochs", minimum=1, where=w)
        checks.number(self.clip_range, "clip_range", minimum=0, exclusive_min=True, where=w)


@dataclass
class GRPOConfig(RLOOConfig):
    """RLOO's settings plus how group advantages are scaled (TRL's ``scale_rewards``)."""

    scale_rewards: str = "group"

    where = "grpo"

    def validate(self) -> None:
        super().validate()
        checks.choice(self.scale_rewards, "scale_rewards", SCALE_REWARDS, where=self.where)


def needs_groups(name: str) -> Callable[[Any], None]:
    """A registry ``check``: refuse a game without groups, before any model loads."""

    def check(run_config: Any) -> None:
        k = run_config.game.group_size
        if k < 2:
            raise checks.SettingError(
                f"{name} needs group_size >= 2 (each query answered k times, each answer "
                f"judged against the others), got {k}; set e.g. --group_size 4 and a "
                "batch_size that is a multiple of it"
            )

    return check


class GroupAgent(LLMLearner):
    """A critic-free learner that reads each query's k answers as one group."""

    has_critic = False

    def __init__(
        self,
        policy: PolicyWithValue,
        reference: Reference,
        config: RLOOConfig,
        pad_token_id: int,
        group_size: int,
        accelerator: Any = None,
        seed: int = 0,
    ) -> None:
        if group_size < 2:
            raise checks.SettingError(f"{self.name} needs group_size >= 2, got {group_size}")
        super().__init__(policy, reference, config, pad_token_id, accelerator, seed)
        self.group_size = group_size

    def group_stats(self, rewards: torch.Tensor) -> dict[str, float]:
        """How often a group's answers all scored alike (no signal for that query)."""
        std = rewards.view(-1, self.group_size).std(dim=1)
        return {f"{self.name}/frac_reward_zero_std": float((std < 1e-8).float().mean())}


class RLOOAgent(GroupAgent):
    """RLOO: leave-one-out advantages of KL-penalised sequence rewards (module doc)."""

    name = "rloo"

    def learn(self) -> dict[str, float]:
        cfg, ro = self.config, self.take_rollout()
        kl = self.reference_kl(ro)
        scores = self.scaled_rewards(ro)
        beta = float(self.kl_ctl.value)
        rewards = scores - beta * kl.sum(dim=1)
        advantages = pg.rloo_advantages(rewards, self.group_size)
        if cfg.whiten_advantages:
            advantages = pg.normalize(advantages)
        data = {**ro.batch_tensors(), "advantages": advantages}

        def rloo_loss(mb: dict, logits: torch.Tensor, values: Any) -> tuple[Any, dict]:
            logprobs = self.sampled_logprobs(logits, mb)
            seq = (logprobs * mb["mask"]).sum(dim=1, keepdim=True)
            old = (mb["old_logprobs"] * mb["mask"]).sum(dim=1, keepdim=True)
            loss, seq_stats = pm.policy_loss(
                seq, old, mb["advantages"][:, None], torch.ones_like(seq), cfg.clip_range
            )
            # The clip acts on answers; approx_kl and ratio are per token, as every learner's.
            return loss, {"loss": loss, "clipfrac": seq_stats["clipfrac"],
                          "seq_approx_kl": seq_stats["approx_kl"], "seq_ratio": seq_stats["ratio"],
                          **pm.ratio_stats(logprobs, mb["old_logprobs"], mb["mask"])}  # fmt: skip

        stats = minibatch_update(self, data, rloo_loss, epochs=cfg.ppo_epochs, unit="answer")
        return {
            **stats,
            **self.finish(ro, kl, beta, scores),
            **self.group_stats(rewards),
            "rloo/rewards_mean": float(rewards.mean()),
        }


class GRPOAgent(GroupAgent):
    """GRPO: group-normalised advantages, clipped token ratios, k3 KL in the loss (module doc)."""

    name = "grpo"

    def learn(self) -> dict[str, float]:
        cfg, ro = self.config, self.take_rollout()
        kl, ref_logprobs = self.reference_pass(ro)
        scores = self.scaled_rewards(ro)
        beta = float(self.kl_ctl.value)
        advantages = pg.grpo_advantages(scores, self.group_size, cfg.scale_rewards)
        data = {**ro.batch_tensors(), "advantages": advantages, "ref_logprobs": ref_logprobs}

        def grpo_loss(mb: dict, logits: torch.Tensor, values: Any) -> tuple[Any, dict]:
            own = pm.selective_log_softmax(logits, mb["tokens"])
            logprobs = own if self.sampling.is_model else self.sampled_logprobs(logits, mb)
            adv = mb["advantages"][:, None].expand_as(logprobs)
            pg_loss, pg_stats = pm.policy_loss(
                logprobs, mb["old_logprobs"], adv, mb["mask"], cfg.clip_range
            )
            if not self.needs_reference_pass:  # beta fixed at 0: no reference, no k3 term
                return pg_loss, {"loss": pg_loss, "loss_policy": pg_loss, **pg_stats}
            k3 = pm.masked_mean(pm.kl_sampled(own, mb["ref_logprobs"], "k3"), mb["mask"])
            loss = pg_loss + beta * k3
            return loss, {"loss": loss, "loss_policy": pg_loss, "loss_kl": k3, **pg_stats}

        stats = minibatch_update(self, data, grpo_loss, epochs=cfg.ppo_epochs)
        return {**stats, **self.finish(ro, kl, beta, scores), **self.group_stats(scores)}


def _build(cls: type[GroupAgent], seat: Seat) -> GroupAgent:
    policy, reference = seat.model_pool.policy(seat.model, seat.agent)
    return cls(
        policy,
        reference,
        seat.settings,
        seat.pad_token_id,
        seat.group_size,
        seat.accelerator,
        seed=seat.seed,
    )


@register_learner("rloo", config=RLOOConfig, check=needs_groups("rloo"))
def make_rloo_agent(seat: Seat) -> GroupAgent:
    """RLOO: leave-one-out baseline over k answers per query, KL in the reward, no critic."""
    return _build(RLOOAgent, seat)


@register_learner("grpo", config=GRPOConfig, check=needs_groups("grpo"))
def make_grpo_agent(seat: Seat) -> GroupAgent:
    """GRPO: group-normalised advantages, clipped PPO loss with a k3 KL term, no critic."""
    return _build(GRPOAgent, seat)
