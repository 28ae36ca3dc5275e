"""The one mini-batch update every LLM learner steps its loss with (PPO, REINFORCE, RLOO, GRPO).

``epochs`` passes over the batch in shuffled mini-batches, one optimiser step per
mini-batch. A mini-batch accumulates ``gradient_accumulation_steps`` micro-batches, and a
micro-batch is computed in chunks of ``forward_batch_size`` rows, ordered by prompt length
so that a chunk drops the padding all its rows share. Each chunk's loss (a mean over its
units: valid tokens or answers) is weighted by its share of the micro-batch's units, so
the gradient and the logged statistics are exactly the micro-batch's, for a fraction of
the activation memory. Micro-batches are weighted by their rows (TRL 0.7's PPO: each
micro-batch's mean counts alike) or by their units (a mean over the whole mini-batch).
Gradients are clipped to ``max_grad_norm`` when set; when nothing accumulates, Adam steps
inside the backward pass (``agents/speedups.py``).

With ``target_kl`` set, the epochs stop at the first mini-batch whose ``approx_kl`` to the
acting policy (measured before its step, averaged over the processes) exceeds 1.5x the
target, and that mini-batch takes no step: Spinning Up's early stopping, TRL 0.7's
``early_stopping``. ``update/steps`` logs the optimiser steps taken, ``update/stopped_early``
whether the target stopped them.

The learner supplies the loss: ``loss_fn(chunk, logits, values) -> (loss, stats)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from cory_rl.agents import ppo_math as pm
from cory_rl.agents.rollout import by_prompt_length, response_logits

if TYPE_CHECKING:
    from cory_rl.agents.llm import LLMLearner

LossFn = Callable[
    [dict[str, torch.Tensor], torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]
]
"""``(chunk, logits, values) -> (mean loss over the chunk's units, statistics)``: ``chunk``
holds the batch tensors' rows on the device, ``logits`` (B, T, V) are those that predicted
the response tokens (float32), ``values`` (B, T+1) the value head's at the last T+1
positions."""


def minibatch_update(
    learner: LLMLearner,
    data: dict[str, torch.Tensor],
    loss_fn: LossFn,
    *,
    epochs: int,
    unit: Literal["token", "answer"] = "token",
    weigh_micro_batches: Literal["rows", "units"] = "units",
    prefix: str | None = None,
    loss_mask: str = "mask",
) -> dict[str, float]:
    """Step ``loss_fn`` over ``data`` (the rollout's batch tensors, with ``mask`` and
    ``tokens``); return each statistic's mean over the micro-batches, under ``prefix/``
    (default the learner's name): the loss's own, ``entropy`` and ``grad_norm``; and
    ``update/steps`` and ``update/stopped_early``. ``loss_mask`` names the tensor of
    ``data`` whose tokens the loss counts (a unit of ``unit="token"``)."""
    cfg = learner.config
    prefix = prefix or learner.name
    learner.turn_over()  # sharded: train on shards, whatever the last turn held
    mask = data[loss_mask]
    B, T = data["tokens"].shape
    micro = cfg.mini_batch_size // cfg.gradient_accumulation_steps

    def units(rows: torch.Tensor) -> torch.Tensor | int:
        return mask[rows].sum() if unit == "token" else len(rows)

    limit = None if cfg.target_kl is None else 1.5 * cfg.target_kl
    stats: dict[str, list[float]] = defaultdict(list)
    steps, stopped = 0, False
    with learner.step_in_backward.active(learner.steps_in_backward()) as stepping:
        for _ in range(epochs):
            order = torch.randperm(B, generator=learner.shuffle_generator)
            for batch in order.split(cfg.mini_batch_size):
                learner.optimizer.zero_grad(set_to_none=True)
                units_in_batch = float(units(batch))
                batch_kl: list[float] = []
                for rows in batch.split(micro):
                    units_in_micro = units(rows)
                    micro_stats: dict[str, float] = defaultdict(float)
                    for chunk in by_prompt_length(rows, data["prompt_mask"]).split(
                        cfg.forward_batch_size
                    ):
                        mb = learner.rows_on_device(data, chunk, T)
                        share = _fraction(units(chunk), units_in_micro)
                        inputs = (mb["ids"], mb["attention"], mb["positions"])
                        probe = learner.probe.phase("forward", learner, inputs=inputs,
                                                    keep=T + 1)  # fmt: skip
                        with probe, learner.accelerator.autocast():
                            logits, values, _ = learner.policy(*inputs, keep=T + 1)
                        logits = response_logits(logits, T)
                        loss, chunk_stats = loss_fn(mb, logits, values)
                        with torch.no_grad():
                            entropy = pm.entropy_from_logits(logits.detach())
                        chunk_stats["entropy"] = pm.masked_mean(entropy, mb["mask"])
                        for k, v in chunk_stats.items():
                            micro_stats[k] += share * float(torch.as_tensor(v).detach())
                        if stepping and limit is not None:  # the step would happen in backward
                            stopped = _approx_kl(chunk_stats) > limit
                            if stopped:
                                break
                        if weigh_micro_batches == "rows":
                            weighted = loss * share * len(rows) / len(batch)
                        else:
                            in_batch = _fraction(float(units_in_micro), units_in_batch)
                            weighted = loss * share * in_batch
                        with learner.probe.phase("backward", learner):
                            learner.accelerator.backward(weighted)
                    for k, v in micro_stats.items():
                        stats[f"{prefix}/{k}"].append(v)
                    if limit is not None:
                        batch_kl.append(_approx_kl(micro_stats))
                    if stopped:
                        break
                if limit is not None and not stepping:
                    stopped = _mean_over_processes(learner, float(np.mean(batch_kl))) > limit
                if stopped:
                    learner.optimizer.zero_grad(set_to_none=True)  # this mini-batch takes no step
                    break
                if cfg.max_grad_norm is not None:
                    norm = learner.clip_gradients(cfg.max_grad_norm)
                    stats[f"{prefix}/grad_norm"].append(norm)
                if not stepping:
                    with learner.probe.phase("optimiser", learner):
                        learner.optimizer.step()
                steps += 1
            if stopped:
                break
    learner.optimizer.zero_grad(set_to_none=True)  # free the gradients until the next update
    learner.weights_version += 1  # a rollout engine reloads them before its next turn
    return {
        **{k: float(np.mean(v)) for k, v in stats.items()},
        "update/steps": float(steps),
        "update/stopped_early": float(stopped),
    }


def _fraction(part: Any, whole: Any) -> float:
    """part / whole, 0 when the whole is empty (a chunk whose tokens the loss leaves out)."""
    return float(part / whole) if float(whole) else 0.0


def _approx_kl(stats: dict[str, Any]) -> float:
    """The loss's ``approx_kl``: early stopping needs every learner's loss to report it."""
    if "approx_kl" not in stats:
        raise KeyError(
            "target_kl needs the learner's loss to report approx_kl; this one reports "
            f"{sorted(stats)}: unset target_kl or add the statistic to its loss"
        )
    return float(torch.as_tensor(stats["approx_kl"]))


def _mean_over_processes(learner: LLMLearner, value: float) -> float:
    """``value`` averaged over the data-parallel processes, so that all stop together."""
    if learner.accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([value], device=learner.device)
    return float(learner.accelerator.reduce(tensor, reduction="mean"))
