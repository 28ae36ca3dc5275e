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
  (the reward part of the ``kl_penalty`` form, ``agents/kl_penalty.py``; TRL: the k1
  estimate ``logp_old - logp_ref``, i.e. ``kl_penalty: k1``), A_i = R_i - mean_{j != i} R_j,
  optionally normalised over the batch ((A - mean) / (std + 1e-4): TRL's
  ``normalize_advantages``, default off; here PPO's ``whiten_advantages``). Loss: a clipped
  ratio of *sequence* probabilities, rho_i = exp(sum_t logp_t - sum_t logp_old_t),
  -min(rho A, clip(rho, 1-eps, 1+eps_high) A), mean over answers, plus the penalty's loss
  part summed over each answer's tokens (by default each state's exact KL, differentiated).
- **GRPO** (Shao et al. 2024): A_i = (R_i - mean(group)) / (std(group) + 1e-4)
  (``scale_rewards``: group / batch / none, as TRL), with R_i the score less beta times the
  penalty's reward part; per token -min(w A, clip(w, 1 - eps, 1 + eps_high) A) plus the
  penalty's loss part, with w = exp(logp_t - logp_old_t) (or, with
  ``importance_sampling_level: sequence``, GSPO's one ratio per answer, the exponential of
  its mean log-ratio), reduced as TRL's ``loss_type`` says (``pg_math.aggregate_loss``;
  default ``dapo``, TRL's). TRL's own KL term is ``kl_penalty: k3_in_loss``: beta * k3_t
  with k3_t = exp(logp_ref - logp) - (logp_ref - logp) - 1 on the current policy, nothing
  in the reward (its gradient is biased: ``agents/kl_penalty.py``).
  ``whiten_advantages`` does not apply. Both take ``epsilon_high`` (DAPO's clip-higher)
  and ``mask_truncated_completions`` (answers without EOS leave the loss), as TRL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import pg_math as pg
from cory_rl.agents import ppo_math as pm
from cory_rl.agents import turns
from cory_rl.agents.dynamic_sampling import DynamicSampling
from cory_rl.agents.llm import LLMConfig, LLMLearner
from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.registry import Seat, register_learner

SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class RLOOConfig(LLMConfig):
    """The shared LLM settings plus the clipped ratio's epochs and range."""

    ppo_epochs: int = 4
    """Passes over each batch (TRL's ``num_iterations``, mu)."""
    clip_range: float = 0.2
    """TRL's ``epsilon``: the ratio's lower clip, and its upper one unless ``epsilon_high``."""
    epsilon_high: float | None = None
    """The ratio's upper clip (DAPO's clip-higher suggests 0.28); None = ``clip_range``."""
    mask_truncated_completions: bool = False
    """Leave answers that ended without EOS (cut by their budget) out of the loss."""
    dynamic_sampling: bool = False
    """Train on groups whose rewards differ, drawing more batches to fill the batch
    (DAPO; ``agents/dynamic_sampling.py``)."""
    max_extra_batches: int = 4
    """With ``dynamic_sampling``: at most this many more batches per iteration."""

    where = "rloo"

    def validate(self) -> None:
        super().validate()
        w = self.where
        checks.integer(self.ppo_epochs, "ppo_epochs", minimum=1, where=w)
        checks.number(self.clip_range, "clip_range", minimum=0, exclusive_min=True, where=w)
        if self.epsilon_high is not None:  # clip-higher: at least the lower clip
            checks.number(
                self.epsilon_high,
                "epsilon_high",
                minimum=self.clip_range,
                where=w,
                hint="the upper clip of the ratio, at least clip_range (the lower "
                "one); None = clip_range",
            )
        checks.boolean(self.mask_truncated_completions, "mask_truncated_completions", where=w)
        checks.boolean(self.dynamic_sampling, "dynamic_sampling", where=w)
        checks.integer(self.max_extra_batches, "max_extra_batches", minimum=0, where=w)

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.epsilon_high is None else self.epsilon_high


@dataclass
class GRPOConfig(RLOOConfig):
    """RLOO's settings plus TRL's GRPO variants: how group advantages are scaled, how the
    per-token loss is reduced and whether the ratio is per token or per answer."""

    scale_rewards: str = "group"
    """What divides the group-centred rewards (TRL's ``scale_rewards``): ``group`` (each
    group's std), ``batch`` (the batch's std) or ``none`` (Dr. GRPO)."""
    loss_type: str = "dapo"
    """How the per-token loss is reduced (TRL's ``loss_type``, ``pg_math.aggregate_loss``):
    ``grpo``, ``bnpo``, ``dr_grpo`` or ``dapo`` (TRL's default)."""
    importance_sampling_level: str = "token"
    """What one importance ratio covers: ``token`` (GRPO) or ``sequence`` (GSPO: one
    length-normalised ratio per answer)."""

    where = "grpo"

    def validate(self) -> None:
        super().validate()
        w = self.where
        checks.choice(self.scale_rewards, "scale_rewards", SCALE_REWARDS, where=w)
        checks.choice(self.loss_type, "loss_type", pg.LOSS_TYPES, where=w)
        checks.choice(
            self.importance_sampling_level,
            "importance_sampling_level",
            pg.IMPORTANCE_SAMPLING_LEVELS,
            where=w,
        )


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
        eos_token_id: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if group_size < 2:
            raise checks.SettingError(f"{self.name} needs group_size >= 2, got {group_size}")
        if config.mask_truncated_completions and eos_token_id is None:
            raise checks.SettingError(
                f"{self.name}: mask_truncated_completions needs the tokenizer's EOS token "
                "to tell a finished answer from a cut one; this seat has none"
            )
        if getattr(config, "loss_type", None) == "dr_grpo" and not max_new_tokens:
            raise checks.SettingError(
                f"{self.name}: loss_type dr_grpo divides by the longest answer the game "
                "allows, which this seat was not given (Seat.max_new_tokens)"
            )
        super().__init__(policy, reference, config, pad_token_id, accelerator, seed)
        self.group_size = group_size
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.dynamic = None
        if config.dynamic_sampling:
            self.dynamic = DynamicSampling(group_size, config.max_extra_batches, pad_token_id)

    def turn_credit(self, rewards: np.ndarray, roles: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """In a game of several rounds each turn is one answer of its own group (the query's
        k answers at that turn, AT-GRPO's groups), credited with its return, the rewards of
        its seat's turn and later ones (``agents/turns.py``); the KL penalty it pays is its
        own answer's."""
        returns = np.zeros(rewards.shape)
        for role in set(roles):
            columns = [k for k, r in enumerate(roles) if r == role]
            returns[:, columns] = turns.turn_returns(rewards[:, columns])
        return returns, np.ones(returns.shape, dtype=bool)

    def empty_answers(self, rollout: Any) -> Any:
        """Groups must stay whole: a game of one turn in which no token was accepted (a
        refereed match over before this seat's turn) keeps its row, weighted zero in the
        loss (none of its tokens counts), its reward still in its group's baseline."""
        return rollout

    def has_experience(self) -> bool:
        return self.rollout is not None and bool(self.rollout.mask.any())

    def empty_turns(self, rollout: Any) -> Any:
        """Groups must stay whole: in a game of several rounds, a turn in which no token was
        accepted (a refereed match over, or waiting on the other player) keeps its row,
        weighted zero in the loss, its return (``turn_credit``: what this seat's turn and
        later ones were paid) still in its group's baseline."""
        return rollout

    def end_rollout(self, obs: dict[str, Any], rewards: Any) -> None:
        """Keep the finished turn(s); with dynamic sampling, only the groups that differ."""
        super().end_rollout(obs, rewards)
        if self.dynamic is not None:
            self.rollout = self.dynamic.add(self.rollout)

    def wants_more(self) -> bool:
        """Whether the loop should play another batch for this learner this iteration."""
        return self.dynamic is not None and self.dynamic.wants_more()

    def group_stats(self, rewards: torch.Tensor) -> dict[str, float]:
        """How often a group's answers all scored alike (no signal for that query), and
        what dynamic sampling kept, dropped and drew."""
        std = rewards.view(-1, self.group_size).std(dim=1)
        stats = {f"{self.name}/frac_reward_zero_std": float((std < 1e-8).float().mean())}
        if self.dynamic is not None:
            stats.update(self.dynamic.finish(self.name))
        return stats

    def loss_mask(self, ro: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """The tokens the loss counts: every valid one, or with
        ``mask_truncated_completions`` only those of answers that ended with EOS."""
        mask = ro.mask.float()
        if not self.config.mask_truncated_completions:
            return mask, {}
        cut = pg.truncated_rows(ro.tokens, ro.mask, int(self.eos_token_id))
        stats = {f"{self.name}/frac_truncated": float(cut.float().mean())}
        return mask * (~cut).float()[:, None], stats


class RLOOAgent(GroupAgent):
    """RLOO: leave-one-out advantages of KL-penalised sequence rewards (module doc)."""

    name = "rloo"

    def learn(self) -> dict[str, float]:
        cfg, shaped = self.config, self.start_update()  # the rollout, its KL and scores
        ro = shaped.rollout
        in_reward = kp.reward_part(cfg.kl_penalty, shaped.kl)  # agents/kl_penalty.py
        rewards = shaped.scores - shaped.kl_coef * in_reward.sum(dim=1)
        advantages = pg.rloo_advantages(rewards, self.group_size)
        scale: torch.Tensor | float = 1.0  # what the advantages are scaled by
        if cfg.whiten_advantages:
            scale = 1.0 / (advantages.std() + 1e-4)
            advantages = pg.normalize(advantages)
        loss_mask, mask_stats = self.loss_mask(ro)
        data = {
            **ro.batch_tensors(),
            "advantages": advantages,
            "loss_mask": loss_mask,
            **self.shaping.penalty_data(shaped, scale),
        }

        def rloo_loss(mb: dict, logits: torch.Tensor, values: Any) -> tuple[Any, dict]:
            logprobs = self.sampler.sampled_logprobs(logits, mb)
            seq = (logprobs * mb["loss_mask"]).sum(dim=1, keepdim=True)
            old = (mb["old_logprobs"] * mb["loss_mask"]).sum(dim=1, keepdim=True)
            surrogate, low, high = pg.clipped_surrogate(
                seq - old, mb["advantages"][:, None], cfg.clip_range, cfg.clip_high
            )
            loss = ec.weighted_answers(surrogate, mb, mb["loss_mask"]).mean()
            kl_stats = {}
            kl_part = self.shaping.penalty_loss(mb, logits)
            if kl_part is not None:  # the direct part of the KL's gradient, summed per answer
                kl_stats["loss_kl"] = (kl_part * mb["loss_mask"]).sum(dim=1).mean()
                loss = loss + kl_stats["loss_kl"]
            seq_ratio = torch.exp((seq - old).detach())
            # The clip acts on answers; approx_kl and ratio are per token, as every learner's.
            return loss, {
                "loss": loss,
                **kl_stats,
                "clipfrac": (low | high).float().mean(),
                "clipfrac_low": low.float().mean(),
                "clipfrac_high": high.float().mean(),
                "seq_approx_kl": 0.5 * ((seq - old).detach() ** 2).mean(),
                "seq_ratio": seq_ratio.mean(),
                **pm.ratio_stats(logprobs, mb["old_logprobs"], mb["mask"]),
            }

        stats = self.update(data, rloo_loss, epochs=cfg.ppo_epochs, unit="answer")
        return {
            **stats,
            **self.finish(shaped),
            **self.group_stats(rewards),
            **mask_stats,
            "rloo/rewards_mean": float(rewards.mean()),
        }


class GRPOAgent(GroupAgent):
    """GRPO: group-normalised advantages, clipped ratios, k3 KL in the loss, reduced as
    ``loss_type`` says (module doc)."""

    name = "grpo"

    def learn(self) -> dict[str, float]:
        cfg, shaped = self.config, self.start_update()  # the rollout, its KL and scores
        ro, beta = shaped.rollout, shaped.kl_coef
        # The KL penalty's reward part (agents/kl_penalty.py; none for TRL's k3_in_loss).
        rewards = shaped.scores - beta * kp.reward_part(cfg.kl_penalty, shaped.kl).sum(dim=1)
        advantages = pg.grpo_advantages(rewards, self.group_size, cfg.scale_rewards)
        scale = pg.grpo_scale(rewards, self.group_size, cfg.scale_rewards)
        loss_mask, mask_stats = self.loss_mask(ro)
        # dapo's tokens per answer
        mean_length = self.optimisation.mean_over_processes(loss_mask.sum(dim=1))
        data = {
            **ro.batch_tensors(),
            "advantages": advantages,
            "ref_logprobs": shaped.ref_logprobs,
            "loss_mask": loss_mask,
            **self.shaping.penalty_data(shaped, scale),
        }

        def reduce(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return pg.aggregate_loss(
                per_token.expand_as(mask), mask, cfg.loss_type, self.max_new_tokens, mean_length
            )

        def grpo_loss(mb: dict, logits: torch.Tensor, values: Any) -> tuple[Any, dict]:
            own = pm.selective_log_softmax(logits, mb["tokens"])
            if self.sampler.distribution.is_model:  # the distribution drawn from
                logprobs = own
            else:
                logprobs = self.sampler.sampled_logprobs(logits, mb)
            mask = mb["loss_mask"]
            log_w = pg.importance_log_weights(
                logprobs, mb["old_logprobs"], mask, cfg.importance_sampling_level
            )
            surrogate, low, high = pg.clipped_surrogate(
                log_w, mb["advantages"][:, None], cfg.clip_range, cfg.clip_high
            )
            clip_stats = {
                "clipfrac": pm.masked_mean((low | high).expand_as(mask).float(), mb["mask"]),
                "clipfrac_low": pm.masked_mean(low.expand_as(mask).float(), mb["mask"]),
                "clipfrac_high": pm.masked_mean(high.expand_as(mask).float(), mb["mask"]),
                **pm.ratio_stats(logprobs, mb["old_logprobs"], mb["mask"]),
            }
            surrogate = ec.weighted(surrogate, mb)  # TRL: before the KL term is added
            pg_loss = reduce(surrogate, mask)
            kl_part = self.shaping.penalty_loss(
                mb, logits
            )  # weighted; None: no loss part, or beta 0
            if kl_part is None:
                return pg_loss, {"loss": pg_loss, "loss_policy": pg_loss, **clip_stats}
            loss = reduce(surrogate + kl_part, mask)  # TRL: KL in each token's loss
            return loss, {
                "loss": loss,
                "loss_policy": pg_loss,
                "loss_kl": reduce(kl_part, mask),
                **clip_stats,
            }

        unit = "token" if cfg.loss_type == "bnpo" else "answer"
        stats = self.update(
            data,
            grpo_loss,
            epochs=cfg.ppo_epochs,
            unit=unit,
            weigh_micro_batches="rows",
            loss_mask="loss_mask",
        )
        return {
            **stats,
            **self.finish(shaped),
            **self.group_stats(shaped.scores),
            **mask_stats,
        }


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
        eos_token_id=getattr(seat.tokenizer, "eos_token_id", None),
        max_new_tokens=seat.max_new_tokens,
    )


@register_learner("rloo", config=RLOOConfig, check=needs_groups("rloo"))
def make_rloo_agent(seat: Seat) -> GroupAgent:
    """RLOO: leave-one-out baseline over k answers per query, KL in the reward, no critic."""
    return _build(RLOOAgent, seat)


@register_learner("grpo", config=GRPOConfig, check=needs_groups("grpo"))
def make_grpo_agent(seat: Seat) -> GroupAgent:
    """GRPO: group-normalised advantages, clipped PPO loss with a k3 KL term, no critic."""
    return _build(GRPOAgent, seat)
