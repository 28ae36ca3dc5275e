"""What every update of an LLM learner needs: the reference pass, the KL to the reference
and its controller, and the scaled rewards.

A part of :class:`agents.llm.LLMLearner`, kept apart by job.
"""

from __future__ import annotations

from typing import Any

import torch

from cory_rl.agents import ppo_math as pm
from cory_rl.agents.rollout import (
    Rollout,
    by_prompt_length,
    response_logits,
    without_shared_padding,
)


class ReferenceAndKL:
    """The reference, KL and reward scaling of :class:`agents.llm.LLMLearner`."""

    # ------------------------------------------------------------------ what every update needs
    @torch.no_grad()
    def reference_pass(
        self, rollout: Rollout, estimator: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched forward of the reference over the rollout: the KL(pi || pi_ref) per
        response token (by ``estimator``, default the configured one), and the reference
        log-prob of each sampled token (GRPO's k3 term). Both (B, T), zero on padding; both
        zero everywhere, with no forward, for an update that does not use them
        (:attr:`needs_reference_pass`, only when ``estimator`` is not given)."""
        if estimator is None and not self.needs_reference_pass:
            skipped = torch.zeros(rollout.tokens.shape)
            return skipped, skipped
        with self.probe.phase("reference", self):
            return self._reference_pass(rollout, estimator or self.config.kl_estimator)

    @property
    def needs_reference_pass(self) -> bool:
        """Whether the update uses the reference: not under a KL coefficient fixed at 0
        (``adaptive_kl false``, ``init_kl_coef 0``; TRL's GRPO default), where the pass would
        be computed only to be multiplied by 0. As TRL does, the update then skips it: the
        batch's KL is not measured (the learner reports none, zeros stand in for the pass's
        tensors), and the held-out evaluation still measures it."""
        return self.config.adaptive_kl or self.config.init_kl_coef > 0

    def _reference_pass(
        self, rollout: Rollout, estimator: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask, pos = rollout.sequences()
        B, T = rollout.tokens.shape
        kl, token_logprobs = torch.zeros(B, T), torch.zeros(B, T)
        everyone = by_prompt_length(torch.arange(B), rollout.prompt_mask)
        for rows in everyone.split(self.config.forward_batch_size):
            inputs = without_shared_padding(
                mask[rows], ids[rows], mask[rows], pos[rows], keep=T + 1
            )
            inputs = [x.to(self.device) for x in inputs]
            probe = self.probe.phase("reference_forward", self, inputs=inputs, keep=T + 1)
            with probe, self.accelerator.autocast():
                logits = self.reference.logits(*inputs, keep=T + 1)
            # One row at a time: the (T, V) log-softmax and the KL's (T, V) temporaries of a
            # whole chunk would be the reference pass's largest tensors, for no gain in speed.
            for row, row_logits in zip(rows.tolist(), response_logits(logits, T), strict=True):
                ref_lp = torch.log_softmax(row_logits, dim=-1).cpu()
                token_logprobs[row] = ref_lp.gather(-1, rollout.tokens[row, :, None]).squeeze(-1)
                if estimator == "full":
                    kl[row] = pm.kl_per_token(rollout.full_logprobs[row], ref_lp)
        if estimator != "full":
            kl = pm.kl_sampled(rollout.logprobs, token_logprobs, estimator)
        return kl * rollout.mask, token_logprobs * rollout.mask

    def reference_kl(self, rollout: Rollout) -> torch.Tensor:
        """KL(pi || pi_ref) per response token (see :meth:`reference_pass`)."""
        return self.reference_pass(rollout)[0]

    def scaled_rewards(self, rollout: Rollout) -> torch.Tensor:
        """The rewards the game paid (the task scores, mixed by ``lam`` in a cooperative
        game), scaled as ``score_scaling``/``score_norm``/``score_clip`` say."""
        cfg = self.config
        moments = self.score_moments if cfg.score_scaling else None
        return pm.scale_scores(
            rollout.rewards.clone(), moments, cfg.score_scaling, cfg.score_norm, cfg.score_clip
        )

    def _fresh_kl_and_scores(self) -> tuple[Any, pm.RunningMoments]:
        cfg = self.config
        kl_ctl = (
            pm.AdaptiveKLController(cfg.init_kl_coef, cfg.kl_target, cfg.kl_horizon)
            if cfg.adaptive_kl
            else pm.FixedKLController(cfg.init_kl_coef)
        )
        return kl_ctl, pm.RunningMoments()

    def restart(self) -> None:
        """A fresh optimiser state, KL coefficient and score statistics; the weights, the
        value head and the random streams are kept. What the official CORY code's
        save-and-reload at each role exchange amounts to (``restart_on_exchange``)."""
        self.optimizer.state.clear()  # Adam's moments and step counts start again lazily
        self.kl_ctl, self.score_moments = self._fresh_kl_and_scores()
