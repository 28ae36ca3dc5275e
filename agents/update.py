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

The update takes what it works on as arguments: the :class:`Optimisation` (the policy,
Adam and what steps them), the batch tensors, the loss (``loss_fn(chunk, logits, values)
-> (loss, stats)``), the batch settings (:class:`UpdateSettings`) and a ``watch`` that
each forward, backward and optimiser step runs inside (the learner's probe).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal, Protocol

import numpy as np
import torch

from cory_rl.agents import ppo_math as pm
from cory_rl.agents.policy import PolicyWithValue
from cory_rl.agents.rollout import by_prompt_length, response_logits, without_shared_padding
from cory_rl.agents.sharding import full_tensor
from cory_rl.agents.speedups import StepInBackward, make_adam

LossFn = Callable[
    [dict[str, torch.Tensor], torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]
]
"""``(chunk, logits, values) -> (mean loss over the chunk's units, statistics)``: ``chunk``
holds the batch tensors' rows on the device, ``logits`` (B, T, V) are those that predicted
the response tokens (float32), ``values`` (B, T+1) the value head's at the last T+1
positions."""

Watch = Callable[..., contextlib.AbstractContextManager[Any]]
"""``watch(name, **info)``: a context each piece of work runs inside (``agents/llm_probe.py``'s
``Probe``, bound to its learner)."""


class UpdateSettings(Protocol):
    """The settings the update reads (``agents/llm_config.py``'s ``LLMConfig`` has them)."""

    mini_batch_size: int
    gradient_accumulation_steps: int
    forward_batch_size: int
    share_prompt_prefix: bool
    max_grad_norm: float | None
    target_kl: float | None


class Optimisation:
    """What an update steps and how: the policy (wrapped by accelerate, or sharded by
    FSDP2), its Adam, the step inside the backward pass, the generator that shuffles the
    mini-batches, and whether the sharded policy's full weights are held."""

    def __init__(
        self, policy: PolicyWithValue, learning_rate: float, accelerator: Any, shuffle_seed: int
    ) -> None:
        self.accelerator = accelerator
        self.device = accelerator.device
        self.sharding = policy.sharding
        """FSDP2 (``agents/sharding.py``): the pool sharded the policy; None = whole."""
        optimizer = make_adam(policy.trainable_parameters(), learning_rate)
        if self.sharding is None:
            if accelerator.num_processes > 1:  # DDP reduces dense gradients only
                for module in policy.modules():
                    if isinstance(module, torch.nn.Embedding):
                        module.sparse = False
            self.policy, self.optimizer = accelerator.prepare(policy, optimizer)
        else:  # sharded already: DDP must not wrap it, and FSDP2 reduces the gradients
            self.policy, self.optimizer = policy, optimizer
        self.step_in_backward = StepInBackward(self.optimizer, policy.trainable_parameters())
        self.shuffle_generator = torch.Generator().manual_seed(shuffle_seed)
        self.gathered = False
        """Whether the sharded policy's full weights are held (:meth:`gather_weights`)."""

    @property
    def model(self) -> PolicyWithValue:
        """The policy itself, without accelerate's wrapper."""
        return self.accelerator.unwrap_model(self.policy)

    def gather_weights(self) -> None:
        """Sharded: hold the full weights until :meth:`release_weights` (a turn's forwards,
        as many as its longest answer, then make no collective call)."""
        if self.sharding is not None and not self.gathered:
            self.sharding.gather(self.model.sharded_modules())
            self.gathered = True

    def release_weights(self) -> None:
        """Free the full weights :meth:`gather_weights` held: back to the shards."""
        if self.gathered:
            self.sharding.release(self.model.sharded_modules())
            self.gathered = False

    def restart(self) -> None:
        """Adam's moments and step counts start again (lazily, at the next step)."""
        self.optimizer.state.clear()

    def steps_in_backward(self, settings: UpdateSettings) -> bool:
        """Whether the update steps each parameter as soon as its gradient is complete
        (:class:`cory_rl.agents.speedups.StepInBackward`).

        When a mini-batch is one chunk of one micro-batch, nothing accumulates between
        backward passes, so Adam can take each parameter's step inside the backward pass
        and free its gradient at once, for the same update. Clipping needs every gradient
        first, and data-parallel training averages them after the backward pass, so those
        keep the plain step.
        """
        return (
            settings.gradient_accumulation_steps == 1
            and settings.forward_batch_size >= settings.mini_batch_size
            and settings.max_grad_norm is None
            and self.accelerator.num_processes == 1
        )

    def clip_gradients(self, max_norm: float) -> float:
        """Clip the trainable parameters' gradients to ``max_norm``; their norm before."""
        params = self.model.trainable_parameters()
        if self.sharding is None:
            return float(self.accelerator.clip_grad_norm_(params, max_norm))
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(full_tensor(norm))

    def rows_on_device(
        self, data: dict[str, torch.Tensor], rows: torch.Tensor, steps: int
    ) -> dict[str, torch.Tensor]:
        """``rows`` of the batch tensors on the device, their sequences minus the padding
        all those rows share (never the ``steps`` response columns or the one before)."""
        mb = {k: v[rows] for k, v in data.items()}
        mb["ids"], mb["attention"], mb["positions"] = without_shared_padding(
            mb["attention"], mb["ids"], mb["attention"], mb["positions"], keep=steps + 1
        )
        return {k: v.to(self.device) for k, v in mb.items()}

    def mean_over_processes(self, values: torch.Tensor) -> float:
        """The mean of ``values`` over every process's games (data-parallel runs), as TRL
        0.7 updates its KL controller from statistics gathered over all processes."""
        mean = values.float().mean()
        if self.accelerator.num_processes > 1:
            mean = self.accelerator.reduce(mean.to(self.device), reduction="mean")
        return float(mean)


def minibatch_update(
    optimisation: Optimisation,
    data: dict[str, torch.Tensor],
    loss_fn: LossFn,
    settings: UpdateSettings,
    *,
    epochs: int,
    prefix: str,
    watch: Watch,
    unit: Literal["token", "answer"] = "token",
    weigh_micro_batches: Literal["rows", "units"] = "units",
    loss_mask: str = "mask",
) -> dict[str, float]:
    """Step ``loss_fn`` over ``data`` (the rollout's batch tensors, with ``mask`` and
    ``tokens``); return each statistic's mean over the micro-batches, under ``prefix/``:
    the loss's own, ``entropy`` and ``grad_norm``; and ``update/steps`` and
    ``update/stopped_early``. ``loss_mask`` names the tensor of ``data`` whose tokens the
    loss counts (a unit of ``unit="token"``)."""
    cfg, opt = settings, optimisation
    opt.release_weights()  # sharded: train on shards, whatever the last turn held
    mask = data[loss_mask]
    B, T = data["tokens"].shape
    micro = cfg.mini_batch_size // cfg.gradient_accumulation_steps

    def units(rows: torch.Tensor) -> torch.Tensor | int:
        return mask[rows].sum() if unit == "token" else len(rows)

    limit = None if cfg.target_kl is None else 1.5 * cfg.target_kl
    stats: dict[str, list[float]] = defaultdict(list)
    steps, stopped = 0, False
    with opt.step_in_backward.active(opt.steps_in_backward(cfg)) as stepping:
        for _ in range(epochs):
            order = torch.randperm(B, generator=opt.shuffle_generator)
            for batch in order.split(cfg.mini_batch_size):
                opt.optimizer.zero_grad(set_to_none=True)
                units_in_batch = float(units(batch))
                batch_kl: list[float] = []
                for rows in batch.split(micro):
                    units_in_micro = units(rows)
                    micro_stats: dict[str, float] = defaultdict(float)
                    for chunk in by_prompt_length(rows, data["prompt_mask"]).split(
                        cfg.forward_batch_size
                    ):
                        mb = opt.rows_on_device(data, chunk, T)
                        share = _fraction(units(chunk), units_in_micro)
                        inputs = (mb["ids"], mb["attention"], mb["positions"])
                        probe = watch("forward", inputs=inputs, keep=T + 1)
                        with probe, opt.accelerator.autocast():
                            logits, values, _ = opt.policy(
                                *inputs, keep=T + 1, share_prefix=cfg.share_prompt_prefix
                            )
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
                        with watch("backward"):
                            opt.accelerator.backward(weighted)
                    for k, v in micro_stats.items():
                        stats[f"{prefix}/{k}"].append(v)
                    if limit is not None:
                        batch_kl.append(_approx_kl(micro_stats))
                    if stopped:
                        break
                if limit is not None and not stepping:
                    stopped = _mean_over_processes(opt, float(np.mean(batch_kl))) > limit
                if stopped:
                    opt.optimizer.zero_grad(set_to_none=True)  # this mini-batch takes no step
                    break
                if cfg.max_grad_norm is not None:
                    norm = opt.clip_gradients(cfg.max_grad_norm)
                    stats[f"{prefix}/grad_norm"].append(norm)
                # When nothing accumulates (``stepping``, steps_in_backward), the step that
                # runs is not this one: each parameter was stepped during backward, by the
                # post-accumulate-grad hook of StepInBackward (agents/speedups.py).
                if not stepping:
                    with watch("optimiser"):
                        opt.optimizer.step()
                steps += 1
            if stopped:
                break
    opt.optimizer.zero_grad(set_to_none=True)  # free the gradients until the next update
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


def _mean_over_processes(optimisation: Optimisation, value: float) -> float:
    """``value`` averaged over the data-parallel processes, so that all stop together."""
    accelerator = optimisation.accelerator
    if accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([value], device=optimisation.device)
    return float(accelerator.reduce(tensor, reduction="mean"))
