"""REINFORCE with a baseline and PPO's per-token KL penalty, no critic (a rebuttal baseline).

Acting, the reference pass, KL control and persistence are the LLM learner base's
(``agents/llm.py``). ``learn`` does, top to bottom:

1. the KL to the frozen reference per token, as every LLM learner computes it (the exact
   full-vocabulary KL, or the sampled estimator the ``kl_penalty`` form measures);
2. per-token rewards ``r_t = -kl_coef * KL_t`` (the penalty's reward part), the game
   reward (scaled as
   ``score_scaling``/``score_norm``/``score_clip`` say) added at the last token, ``kl_coef``
   from the adaptive or fixed KL controller;
3. returns-to-go ``G_t = sum_{s>=t} gamma^(s-t) r_s`` (in a game of several rounds over
   the agent's turns of a game, ``agents/turns.py``) and a baseline ``b`` (``baseline``);
4. one gradient pass over shuffled mini-batches (``agents/update.py``) of
   ``loss = -mean over valid tokens of logprob_t * (G_t - b)``, plus the penalty's loss
   part (``agents/kl_penalty.py``: by default each state's exact KL, differentiated);
5. the KL controller update from the batch's mean summed KL, as PPO.

``logprob_t`` is taken under the distribution the token was sampled from (agents/sampling.py:
the model's own unless a repetition penalty, temperature, top-k or top-p reshapes it). With
``whiten_advantages`` ``G_t - b`` is divided by its std over the batch (scale only: the
baseline keeps its meaning).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import pg_math as pg
from cory_rl.agents import ppo_math as pm
from cory_rl.agents import state_io, turns
from cory_rl.agents.llm import LLMConfig, LLMLearner
from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.registry import Seat, register_learner

BASELINES = ("batch_mean", "running_mean", "none")


@dataclass
class ReinforceConfig(LLMConfig):
    """The shared LLM settings (acting, KL penalty and controller, score scaling,
    mini-batches), the discount and a baseline.

    ``baseline`` defaults to ``batch_mean``: the mean return-to-go over the batch's valid
    tokens. It follows the reward level at once as the policy improves (a running mean lags
    behind it, and starts from nothing), needs no state, and with score scaling off (the
    baselines' default) the task score can sit far from 0, where no baseline would leave a
    large, high-variance offset. Its own-sample bias is O(1/tokens per batch).
    ``running_mean``: an exponential moving average (``baseline_decay``) of earlier batches'
    means; ``none``: b = 0.
    """

    gamma: float = 1.0
    """Discount of the returns-to-go ``G_t = sum_{s>=t} gamma^(s-t) r_s`` (1 = none)."""
    baseline: str = "batch_mean"
    """The b of ``G_t - b``: ``batch_mean`` (the batch's mean return-to-go),
    ``running_mean`` (an EMA of earlier batches' means) or ``none`` (b = 0)."""
    baseline_decay: float = 0.9
    """Weight of the old value in the ``running_mean`` baseline's update."""

    where = "reinforce"

    def validate(self) -> None:
        super().validate()
        w = self.where
        checks.number(self.gamma, "gamma", minimum=0, maximum=1, where=w)
        checks.choice(self.baseline, "baseline", BASELINES, where=w)
        checks.number(self.baseline_decay, "baseline_decay", minimum=0, maximum=1, where=w)


class ReinforceAgent(LLMLearner):
    """REINFORCE: logprob_t * (G_t - b), one gradient pass per rollout (see the module doc)."""

    name = "reinforce"
    has_critic = False

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
        cfg, shaped = self.config, self.start_update()  # the rollout, its KL and scores
        ro = shaped.rollout
        mask = ro.mask.float()
        in_reward = kp.reward_part(cfg.kl_penalty, shaped.kl)  # agents/kl_penalty.py
        rewards, non_score = pm.token_rewards(shaped.scores, in_reward, mask, shaped.kl_coef)
        returns = turns.returns_to_go(rewards, mask, cfg.gamma, ro.episode, ro.turn)
        b = self.baseline(returns, mask)
        advantages = (returns - b) * mask
        scale: torch.Tensor | float = 1.0  # what the advantages are scaled by
        if cfg.whiten_advantages:
            scale = torch.rsqrt(pm.masked_var(advantages, mask) + 1e-8)
            advantages = pg.scale_only(advantages, mask) * mask
        data = {
            **ro.batch_tensors(),
            "advantages": advantages,
            **self.shaping.penalty_data(shaped, scale),
        }

        def reinforce_loss(mb: dict, logits: torch.Tensor, values: Any) -> tuple[Any, dict]:
            logprobs = self.sampler.sampled_logprobs(logits, mb)
            loss = -pm.masked_mean(ec.weighted(logprobs * mb["advantages"], mb), mb["mask"])
            stats = {"loss": loss, **pm.ratio_stats(logprobs, mb["old_logprobs"], mb["mask"])}
            kl_part = self.shaping.penalty_loss(mb, logits)
            if kl_part is not None:  # the direct part of the KL's gradient
                stats["loss_kl"] = pm.masked_mean(kl_part, mb["mask"])
                loss = loss + stats["loss_kl"]
                stats["loss"] = loss
            return loss, stats

        stats = self.update(data, reinforce_loss, epochs=1)
        return {
            **stats,
            **self.finish(shaped),
            "objective/non_score_reward": float(non_score.sum(dim=1).mean()),
            "reinforce/returns_mean": float(pm.masked_mean(returns, mask)),
            "reinforce/baseline": b,
        }

    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """The base's files, plus the running baseline in ``reinforce.json``."""
        super().save(path, writer)
        state_io.save_json(
            {"baseline": self.running.state_dict()}, Path(path) / "reinforce.json", writer
        )

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
    policy, reference = seat.model_pool.policy(seat.model, seat.agent)
    return ReinforceAgent(
        policy, reference, seat.settings, seat.pad_token_id, seat.accelerator, seed=seat.seed
    )
