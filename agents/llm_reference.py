"""What every update of an LLM learner starts from: the reference pass, the KL to the
reference and its controller, and the scaled rewards.

:class:`RewardShaping` owns the reference, the KL controller and the score statistics; a
part of :class:`cory_rl.agents.llm.LLMLearner`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.policy import Reference
from cory_rl.agents.rollout import (
    Rollout,
    by_prompt_length,
    response_logits,
    without_shared_padding,
)
from cory_rl.agents.update import Watch


@dataclass
class ShapedRollout:
    """A rollout as an update starts from it (:meth:`RewardShaping.shape`)."""

    rollout: Rollout
    kl: torch.Tensor
    """(B, T) KL(pi || pi_ref) per response token, zero on padding."""
    ref_logprobs: torch.Tensor
    """(B, T) the reference's log-prob of each sampled token (GRPO's k3 term)."""
    scores: torch.Tensor
    """(B,) the rewards the game paid, scaled (:meth:`RewardShaping.scaled_rewards`)."""
    kl_coef: float
    """The KL coefficient in force for this update (the controller moves after it)."""
    ref_full_logprobs: torch.Tensor | None = None
    """(B, T, V) the reference's log-probs over the vocabulary at each response position,
    kept only for a KL penalty whose loss part is the exact KL (``kl_penalty: full``)."""


class RewardShaping:
    """The reference, the KL to it with its controller, and the score scaling: what turns
    the rewards a game paid into those an update learns from."""

    def __init__(
        self,
        reference: Reference,
        settings: Any,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        """``settings``: ``agents/llm_config.py``'s ``LLMConfig`` (the KL, score and
        ``forward_batch_size`` settings)."""
        if not reference.adapters_disabled:
            reference.lm.to(device)
        self.reference = reference
        self.settings = settings
        self.device = device
        self.autocast = autocast
        self.needs_reference_pass = settings.adaptive_kl or settings.init_kl_coef > 0
        """Whether the update uses the reference: not under a KL coefficient fixed at 0
        (``adaptive_kl false``, ``init_kl_coef 0``; TRL's GRPO default), where the pass would
        be computed only to be multiplied by 0. As TRL does, the update then skips it: the
        batch's KL is not measured (the learner reports none, zeros stand in for the pass's
        tensors), and the held-out evaluation still measures it."""
        self.kl_ctl, self.score_moments = self._fresh_kl_and_scores()

    def shape(self, rollout: Rollout, watch: Watch) -> ShapedRollout:
        """The reference pass and the scaled rewards of ``rollout``, with the KL coefficient
        in force. The shaped rollout goes without the full log-probs: (B, T, V), needed
        only for the KL, so not held while learning; the reference's are kept where the
        penalty's loss part needs them."""
        ref_full = None
        if self.needs_reference_pass and kp.needs_reference_full_logprobs(self.settings.kl_penalty):
            with watch("reference"):
                kl, ref_logprobs, ref_full = self._reference_pass(
                    rollout, self.measure, watch, keep_full=True
                )
        else:
            kl, ref_logprobs = self.reference_pass(rollout, watch)
        scores = self.scaled_rewards(rollout)
        without_full = dataclasses.replace(rollout, full_logprobs=None)
        return ShapedRollout(
            without_full, kl, ref_logprobs, scores, float(self.kl_ctl.value), ref_full
        )

    @property
    def measure(self) -> str:
        """How the configured penalty measures the KL per token (``full`` or a sampled
        estimator)."""
        return kp.form(self.settings.kl_penalty).measure

    @torch.no_grad()
    def reference_pass(
        self, rollout: Rollout, watch: Watch, measure: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched forward of the reference over the rollout: the KL(pi || pi_ref) per
        response token (measured as ``measure`` says, ``full`` or a sampled estimator;
        default as the configured penalty measures it), and the reference log-prob of each
        sampled token (the k3 term). Both (B, T), zero on padding; both zero everywhere, with
        no forward, for an update that does not use them (:attr:`needs_reference_pass`, only
        when ``measure`` is not given). The pass runs inside ``watch("reference")``, each
        chunk inside ``watch("reference_forward")``."""
        if measure is None and not self.needs_reference_pass:
            skipped = torch.zeros(rollout.tokens.shape)
            return skipped, skipped
        with watch("reference"):
            kl, token_logprobs, _ = self._reference_pass(rollout, measure or self.measure, watch)
            return kl, token_logprobs

    def _reference_pass(
        self, rollout: Rollout, measure: str, watch: Watch, keep_full: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ids, mask, pos = rollout.sequences()
        B, T = rollout.tokens.shape
        kl, token_logprobs = torch.zeros(B, T), torch.zeros(B, T)
        ref_full = None
        everyone = by_prompt_length(torch.arange(B), rollout.prompt_mask)
        for rows in everyone.split(self.settings.forward_batch_size):
            inputs = without_shared_padding(
                mask[rows], ids[rows], mask[rows], pos[rows], keep=T + 1
            )
            inputs = [x.to(self.device) for x in inputs]
            probe = watch("reference_forward", inputs=inputs, keep=T + 1)
            with probe, self.autocast():
                logits = self.reference.logits(
                    *inputs, keep=T + 1, share_prefix=self.settings.share_prompt_prefix
                )
            # One row at a time: the (T, V) log-softmax and the KL's (T, V) temporaries of a
            # whole chunk would be the reference pass's largest tensors, for no gain in speed.
            for row, row_logits in zip(rows.tolist(), response_logits(logits, T), strict=True):
                ref_lp = torch.log_softmax(row_logits, dim=-1).cpu()
                token_logprobs[row] = ref_lp.gather(-1, rollout.tokens[row, :, None]).squeeze(-1)
                if measure == "full":
                    kl[row] = pm.kl_per_token(rollout.full_logprobs[row], ref_lp)
                if keep_full:
                    if ref_full is None:
                        ref_full = torch.zeros(B, T, ref_lp.shape[-1])
                    ref_full[row] = ref_lp
        if measure != "full":
            kl = pm.kl_sampled(rollout.logprobs, token_logprobs, measure)
        return kl * rollout.mask, token_logprobs * rollout.mask, ref_full

    def penalty_data(
        self, shaped: ShapedRollout, advantage_scale: torch.Tensor | float = 1.0
    ) -> dict[str, torch.Tensor]:
        """What the loss part of the KL penalty reads from the batch (:meth:`penalty_loss`):
        its weight per row (``kl_weight``: beta, times ``advantage_scale``, what the
        advantages were scaled by, for an exact form) and the reference's log-probs. Empty
        for a form with no loss part, or with no reference pass (beta fixed at 0)."""
        name = self.settings.kl_penalty
        if not self.needs_reference_pass or kp.form(name).in_loss is None:
            return {}
        rows = len(shaped.rollout.rewards)
        weight = kp.loss_weight(name, shaped.kl_coef, advantage_scale)
        data = {"kl_weight": weight.expand(rows).clone(), "ref_logprobs": shaped.ref_logprobs}
        if shaped.ref_full_logprobs is not None:
            data["ref_full_logprobs"] = shaped.ref_full_logprobs
        return data

    def penalty_loss(
        self, mb: dict[str, torch.Tensor], logits: torch.Tensor
    ) -> torch.Tensor | None:
        """The KL penalty's loss part per token (B, T), weighted by ``kl_weight``, with its
        gradient (``agents/kl_penalty.py``); None where :meth:`penalty_data` gave nothing.
        The KL is the model's own distribution's, whatever the sampling settings."""
        if "kl_weight" not in mb:
            return None
        name = self.settings.kl_penalty
        own = None
        if kp.form(name).in_loss == "k3":
            own = pm.selective_log_softmax(logits, mb["tokens"])
        part = kp.loss_part(name, logits, own, mb["ref_logprobs"], mb.get("ref_full_logprobs"))
        return mb["kl_weight"][:, None].to(part.dtype) * part

    def scaled_rewards(self, rollout: Rollout) -> torch.Tensor:
        """The rewards the game paid (the task scores, mixed by ``lam`` in a cooperative
        game), scaled as ``score_scaling``/``score_norm``/``score_clip`` say. In a game of
        several rounds only the turns paid are scaled (and counted in the statistics); the
        others stay 0."""
        cfg = self.settings
        moments = self.score_moments if cfg.score_scaling else None

        def scale(rewards: torch.Tensor) -> torch.Tensor:
            return pm.scale_scores(
                rewards, moments, cfg.score_scaling, cfg.score_norm, cfg.score_clip
            )

        if rollout.paid is None or bool(rollout.paid.all()):
            return scale(rollout.rewards.clone())
        scores = torch.zeros_like(rollout.rewards)
        if rollout.paid.any():
            scores[rollout.paid] = scale(rollout.rewards[rollout.paid].clone())
        return scores

    def _fresh_kl_and_scores(self) -> tuple[Any, pm.RunningMoments]:
        cfg = self.settings
        kl_ctl = (
            pm.AdaptiveKLController(cfg.init_kl_coef, cfg.kl_target, cfg.kl_horizon)
            if cfg.adaptive_kl
            else pm.FixedKLController(cfg.init_kl_coef)
        )
        return kl_ctl, pm.RunningMoments()

    def restart(self) -> None:
        """A fresh KL coefficient and fresh score statistics."""
        self.kl_ctl, self.score_moments = self._fresh_kl_and_scores()
