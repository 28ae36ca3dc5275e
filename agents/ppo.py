"""Token-level PPO for a causal LM, playing one seat of the text game (TRL 0.7's formulation,
as the official CORY code).

Acting, the reference pass, KL control and persistence are the LLM learner base's
(``agents/llm.py``). ``learn`` does, top to bottom:

1. one batched forward of the frozen reference over the whole sequences: KL per token
   (``start_update``, with the scaled game rewards);
2. per-token rewards ``-kl_coef * KL_t`` with the (scaled) game reward at the last token
   (the reward part of the ``kl_penalty`` form, ``agents/kl_penalty.py``);
3. GAE advantages (whitened) and returns from the values recorded while acting (in a game
   of several rounds over each of the agent's trajectories of turns, ``agents/turns.py``);
4. ``ppo_epochs`` passes over shuffled mini-batches of clipped policy + value loss, plus
   the penalty's loss part (by default each state's exact KL, differentiated, weighted by
   ``kl_coef`` divided by the advantages' std where they are whitened; ``agents/update.py``
   steps it);
5. the KL controller update from the batch's mean summed KL (``finish``).

Each term of the math is checked against hand-computed values in ``agents/ppo_math.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import ppo_math as pm
from cory_rl.agents import turns
from cory_rl.agents.llm import LLMConfig, LLMLearner
from cory_rl.agents.registry import Seat, register_learner


@dataclass
class PPOConfig(LLMConfig):
    """The shared LLM settings plus PPO's own (defaults: CORY's IMDB settings)."""

    ppo_epochs: int = 4
    """Passes over each batch, each in shuffled mini-batches (TRL 0.7's ``ppo_epochs``)."""
    gamma: float = 1.0
    """Discount of the per-token rewards in GAE (1 = none)."""
    gae_lambda: float = 0.95
    """GAE's lambda, from one-step TD advantages (0) to Monte Carlo returns (1)."""
    clip_range: float = 0.2
    """The policy ratio's clip, to [1 - clip_range, 1 + clip_range] (TRL 0.7's
    ``cliprange``)."""
    clip_range_value: float = 0.2
    """The value head's clip: new values stay within this of those recorded while acting
    (TRL 0.7's ``cliprange_value``)."""
    vf_coef: float = 0.1
    """Weight of the value loss beside the policy loss."""
    ratio_threshold: float | None = 10.0
    """Skip a chunk whose mean PPO ratio exceeds this (TRL 0.7's guard against loss
    spikes, default 10); None = never skip."""

    where = "ppo"

    def validate(self) -> None:
        super().validate()
        w = self.where
        for name in ("clip_range", "clip_range_value"):
            checks.number(getattr(self, name), name, minimum=0, exclusive_min=True, where=w)
        for name in ("gamma", "gae_lambda"):
            checks.number(getattr(self, name), name, minimum=0, maximum=1, where=w)
        checks.number(self.vf_coef, "vf_coef", minimum=0, where=w)
        if self.ratio_threshold is not None:
            checks.number(
                self.ratio_threshold, "ratio_threshold", minimum=0, exclusive_min=True, where=w
            )
        checks.integer(self.ppo_epochs, "ppo_epochs", minimum=1, where=w)


class PPOAgent(LLMLearner):
    """One PPO learner (a :class:`cory_rl.agents.base.Learner`): policy, critic, optimiser,
    KL control."""

    name = "ppo"

    def learn(self) -> dict[str, float]:
        """One PPO update on the rollout collected since the last call."""
        cfg, shaped = self.config, self.start_update()  # the rollout, its KL and scores
        ro = shaped.rollout
        mask = ro.mask.float()

        # Rewards: the KL penalty's reward part at every token, the (scaled) game reward at
        # the last one (agents/kl_penalty.py).
        in_reward = kp.reward_part(cfg.kl_penalty, shaped.kl)
        rewards, non_score = pm.token_rewards(shaped.scores, in_reward, mask, shaped.kl_coef)
        # Advantages and value targets from the values recorded while acting (over an
        # agent's turns of a game, in a game of several rounds).
        advantages, returns = turns.gae(
            rewards, ro.values, mask, cfg.gamma, cfg.gae_lambda, ro.episode, ro.turn
        )
        scale: torch.Tensor | float = 1.0  # what the advantages are scaled by
        if cfg.whiten_advantages:
            scale = torch.rsqrt(pm.masked_var(advantages, mask) + 1e-8)
            advantages = pm.masked_whiten(advantages, mask)
        data = {
            **ro.batch_tensors(),
            "old_values": ro.values,
            "advantages": advantages,
            "returns": returns,
            **self.shaping.penalty_data(shaped, scale),  # the KL penalty's loss part, if any
        }

        def ppo_loss(
            mb: dict[str, torch.Tensor], logits: torch.Tensor, values: torch.Tensor
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            """Clipped policy loss + vf_coef * clipped value loss, token means."""
            logprobs = self.sampler.sampled_logprobs(logits, mb)
            pg_loss, pg_stats = pm.policy_loss(
                logprobs,
                mb["old_logprobs"],
                mb["advantages"],
                mb["mask"],
                cfg.clip_range,
                weights=mb.get(ec.WEIGHTS),
            )
            vf_loss, vf_stats = pm.value_loss(
                values[:, :-1].float(),
                mb["old_values"],
                mb["returns"],
                mb["mask"],
                cfg.clip_range_value,
            )
            loss = pg_loss + cfg.vf_coef * vf_loss
            kl_stats = {}
            kl_part = self.shaping.penalty_loss(mb, logits)
            if kl_part is not None:  # the direct part of the KL's gradient
                kl_loss = pm.masked_mean(kl_part, mb["mask"])
                loss = loss + kl_loss
                kl_stats["loss_kl"] = kl_loss
            threshold = cfg.ratio_threshold
            skip = threshold is not None and bool(pg_stats["ratio"] > threshold)
            if skip:  # TRL 0.7: a spiking ratio would blow the update up
                loss = loss * 0.0
            return loss, {
                "loss_policy": pg_loss,
                "loss_value": vf_loss,
                "loss_total": loss,
                "skipped_fraction": float(skip),
                **kl_stats,
                **pg_stats,
                **vf_stats,
            }

        # TRL 0.7 averages the micro-batches' token means: micro-batches weigh by rows.
        stats = self.update(
            data,
            ppo_loss,
            epochs=cfg.ppo_epochs,
            unit="token",
            weigh_micro_batches="rows",
            prefix="ppo",
        )
        return {
            **stats,
            **self.finish(shaped),  # the KL controller update, shared stats
            "objective/non_score_reward": float(non_score.sum(dim=1).mean()),
            "ppo/returns_mean": float(pm.masked_mean(returns, mask)),
            "ppo/values_mean": float(pm.masked_mean(ro.values, mask)),
        }


@register_learner("ppo", config=PPOConfig)
def make_ppo_agent(seat: Seat) -> PPOAgent:
    """Token-level PPO with a value head (TRL 0.7 formulation, as the official CORY code)."""
    policy, reference = seat.model_pool.policy(seat.model, seat.agent)
    return PPOAgent(
        policy, reference, seat.settings, seat.pad_token_id, seat.accelerator, seed=seat.seed
    )
