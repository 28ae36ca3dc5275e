"""An LLM learner's seat on a rollout engine (vLLM): whole turns planned by the engine,
the engine kept on the learner's weights, and the engine correction of the tokens it drew.

:class:`EngineSeat` owns the engine, its EOS token, the gaps between its log-probs and the
learner's, and the last correction's statistics; a part of
:class:`cory_rl.agents.llm.LLMLearner`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.engine import RolloutEngine, SamplingSettings, hf_weights
from cory_rl.agents.llm_acting import TokenSampler
from cory_rl.agents.policy import PolicyWithValue
from cory_rl.agents.rollout import Rollout, Turn, response_logits
from cory_rl.agents.sharding import full_tensors


def engine_weights(model: PolicyWithValue) -> Iterable[tuple[str, torch.Tensor]]:
    """A seat's language model as a checkpoint's weights (its adapter merged)."""
    return hf_weights(model.lm, model.adapter)


def save_adapter(model: PolicyWithValue, folder: Path) -> None:
    """A seat's LoRA adapter as peft writes one (for an engine's LoRA request)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    lm, name = model.lm, model.adapter
    folder.mkdir(parents=True, exist_ok=True)
    state = full_tensors(get_peft_model_state_dict(lm, adapter_name=name))  # if sharded
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "adapter_model.safetensors")
    lm.peft_config[name].save_pretrained(str(folder))


def engine_logprobs(turn: Turn, mask: torch.Tensor) -> torch.Tensor | None:
    """The engine's log-probs of a planned turn's accepted tokens (0 elsewhere); None for
    a turn played token by token."""
    if not turn.engine_logprobs:
        return None
    engine_lp = torch.stack(turn.engine_logprobs, dim=1)
    return torch.where(mask.bool(), engine_lp, torch.zeros_like(engine_lp))


class EngineSeat:
    """Where whole turns come from when a rollout engine is attached (``agents/engine.py``),
    and how far its tokens' log-probs were from the learner's."""

    def __init__(
        self,
        settings: Any,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        """``settings``: ``agents/llm_config.py``'s ``LLMConfig`` (sampling, ``forward_batch_size``,
        ``kl_penalty`` and the ``engine_correction`` settings)."""
        self.settings = settings
        self.device = device
        self.autocast = autocast
        self.engine: RolloutEngine | None = None
        """None = the learner acts token by token."""
        self.eos_token_id: int | None = None
        self.gaps: list[torch.Tensor] = []
        """The engine's log-prob minus the learner's, per planned token, since :meth:`stats`."""
        self.correction_stats: dict[str, float] = {}

    def attach(self, engine: RolloutEngine | None, eos_token_id: int) -> None:
        """Take whole turns from ``engine`` (None: act token by token again); the game
        ends a row at ``eos_token_id``, the engine too."""
        self.engine, self.eos_token_id = engine, int(eos_token_id)

    def _hold(self, model: PolicyWithValue, weights_version: int) -> None:
        """The engine samples from ``model`` at ``weights_version`` (this seat is the owner
        it knows the weights by): its adapter, or its whole weights."""
        if model.adapter is not None and getattr(self.engine, "adapters", False):
            self.engine.hold_adapter(self, weights_version, partial(save_adapter, model))
        else:
            self.engine.hold(self, weights_version, partial(engine_weights, model))

    @torch.no_grad()
    def plan_turn(
        self,
        turn: Turn,
        obs: dict[str, np.ndarray],
        model: PolicyWithValue,
        sampler: TokenSampler,
        weights_version: int,
    ) -> None:
        """The whole of ``turn`` from the engine (on ``model``'s weights at
        ``weights_version``, seeded from ``sampler``'s generator), then ``model``'s own
        log-probs and values of it, as acting token by token would have recorded them."""
        cfg = self.settings
        if "budget" not in obs:
            raise ValueError("a rollout engine needs each game's token budget: obs['budget']")
        budgets = [int(b) for b in np.asarray(obs["budget"])]
        B = len(budgets)
        pairs = zip(turn.prompt_ids, turn.prompt_mask, strict=True)
        prompts = [ids[m.bool()].tolist() for ids, m in pairs]
        seeds = torch.randint(2**31 - 1, (B,), generator=sampler.generator, device=self.device)
        self._hold(model, weights_version)
        sampling = SamplingSettings(cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty)
        answer = self.engine.generate(prompts, budgets, sampling, seeds.tolist(), self.eos_token_id)
        for b, ids in enumerate(answer.tokens):
            if len(ids) < budgets[b] and (not ids or ids[-1] != self.eos_token_id):
                raise RuntimeError(
                    f"the engine ended game {b}'s answer after {len(ids)} of {budgets[b]} "
                    "tokens without EOS (is the engine's max_model_len too short?)"
                )
        T = max(1, max(len(ids) for ids in answer.tokens))
        tokens = torch.full((B, T), self.eos_token_id, dtype=torch.long)  # after EOS: ignored
        engine_lp, seen = torch.full((B, T), float("nan")), torch.zeros(B, T, dtype=torch.bool)
        for b, (ids, lps) in enumerate(zip(answer.tokens, answer.logprobs, strict=True)):
            tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            engine_lp[b, : len(lps)] = torch.tensor(lps)
            seen[b, : len(lps)] = True
        ids = torch.cat([turn.prompt_ids, tokens], dim=1)
        mask = torch.cat([turn.prompt_mask, torch.ones_like(tokens)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        columns: dict[str, list[torch.Tensor]] = {
            "logprobs": [],
            "sample_logprobs": [],
            "values": [],
            "full_logprobs": [],
            "entropies": [],
        }
        for rows in torch.arange(B).split(cfg.forward_batch_size):
            inputs = [x[rows].to(self.device) for x in (ids, mask, positions)]
            with self.autocast():
                logits, values, _ = model(*inputs, keep=T + 1, share_prefix=cfg.share_prompt_prefix)
            logits = response_logits(logits, T)
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen = tokens[rows].to(self.device)
            mb = {
                "prompt_ids": inputs[0][:, :-T],
                "prompt_mask": inputs[1][:, :-T],
                "tokens": chosen,
            }
            own = logprobs.gather(-1, chosen[..., None]).squeeze(-1)
            if sampler.distribution.is_model:  # the distribution drawn from is the model's
                sampled = own
            else:
                sampled = sampler.sampled_logprobs(logits, mb)
            columns["logprobs"].append(own.cpu())
            columns["sample_logprobs"].append(sampled.cpu())
            columns["values"].append(values[:, :-1].float().cpu())
            if kp.needs_full_logprobs(cfg.kl_penalty):
                columns["full_logprobs"].append(logprobs.cpu())
            else:
                columns["entropies"].append(pm.entropy_from_logits(logits).cpu())
        whole = {k: torch.cat(v) for k, v in columns.items() if v}
        for t in range(T):
            turn.tokens.append(tokens[:, t])
            turn.engine_logprobs.append(engine_lp[:, t])
            for name, column in whole.items():
                getattr(turn, name).append(column[:, t])
        gap = engine_lp - whole["sample_logprobs"]
        self.gaps.append(gap[seen])
        turn.planned = True

    def correction_weights(self, rollout: Rollout) -> torch.Tensor | None:
        """The engine correction's weights of ``rollout`` (``agents/engine_correction.py``),
        its statistics kept for :meth:`stats`; None when no engine sampled it or
        ``engine_correction`` is off."""
        cfg = self.settings
        if rollout.engine_logprobs is None or not cfg.engine_correction:
            return None
        weights, self.correction_stats = ec.correction_weights(
            rollout.sample_logprobs,
            rollout.engine_logprobs,
            rollout.mask,
            cfg.engine_correction_mode,
            cfg.engine_correction_cap,
            cfg.engine_correction_floor,
        )
        return weights

    def stats(self) -> dict[str, float]:
        """How far the engine's log-probs of its tokens were from the learner's since the
        last call: ``kl`` (their mean difference, a k1 estimate of KL(engine || learner)
        per token) and the largest absolute gap; and the last correction's statistics
        (``is_*``). Empty without an engine."""
        stats, self.correction_stats = self.correction_stats, {}
        if not self.gaps:
            return stats
        gaps, self.gaps = torch.cat(self.gaps), []
        return {
            "engine/kl": float(gaps.mean()),
            "engine/max_abs_gap": float(gaps.abs().max()),
            **stats,
        }
