"""An LLM learner's persistence: its state saved and loaded exactly, and its random
streams per process. Each function takes the parts of
:class:`cory_rl.agents.llm.LLMLearner` it reads or restores: the
:class:`cory_rl.agents.update.Optimisation` (policy and Adam), the
:class:`cory_rl.agents.llm_acting.TokenSampler` (the sampling stream) and the
:class:`cory_rl.agents.llm_reference.RewardShaping` (KL controller and score statistics).
Export is ``agents/export.py``'s.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cory_rl.agents import state_io
from cory_rl.agents.llm_acting import TokenSampler
from cory_rl.agents.llm_reference import RewardShaping
from cory_rl.agents.sharding import (
    full_optimizer_state,
    full_tensors,
    load_full,
    sharded_optimizer_state,
)
from cory_rl.agents.update import Optimisation

LEARNER_STATE_FORMAT = 1
"""Version of the files :func:`save` writes."""


def save(
    path: Path,
    name: str,
    config: Any,
    optimisation: Optimisation,
    sampler: TokenSampler,
    shaping: RewardShaping,
    writer: state_io.WriteQueue | None = None,
) -> None:
    """Weights, optimiser and RNG states as safetensors; the rest (the learner's ``name``
    and ``config`` among it) as JSON, written last (or queued on ``writer``, in that order).

    Sharded, every process calls it: the full tensors are gathered on every process
    (``agents/sharding.py``), and the main one writes them, as one process would."""
    path = Path(path)
    sharding = optimisation.sharding
    policy = optimisation.model.policy_state_dict()
    optimizer = optimisation.optimizer.state_dict()
    if sharding is not None:
        main = sharding.is_main
        policy, optimizer = full_tensors(policy, main), full_optimizer_state(optimizer, main)
        if not main:
            return
    path.mkdir(parents=True, exist_ok=True)
    state_io.save_tensors(policy, path / "policy.safetensors", writer)
    optimizer_tensors, optimizer_rest = state_io.split_optimizer_state(optimizer)
    tensors = {f"optimizer.{k}": v for k, v in optimizer_tensors.items()}
    tensors["rng.sampling"] = sampler.generator.get_state()
    tensors["rng.shuffle"] = optimisation.shuffle_generator.get_state()
    state_io.save_tensors(tensors, path / "state.safetensors", writer)
    state_io.save_json(
        {
            "format": LEARNER_STATE_FORMAT,
            "learner": name,
            "optimizer": optimizer_rest,
            "kl_ctl": shaping.kl_ctl.state_dict(),
            "score_moments": shaping.score_moments.state_dict(),
            "config": asdict(config),
        },
        path / "agent.json",
        writer,
    )


def load(
    path: Path,
    name: str,
    optimisation: Optimisation,
    sampler: TokenSampler,
    shaping: RewardShaping,
) -> None:
    """Restore what :func:`save` wrote for a learner called ``name``; a bad file raises
    ``CheckpointError`` naming it."""
    path = Path(path)
    meta = state_io.require(
        state_io.load_json(path / "agent.json"),
        ("format", "learner", "optimizer", "kl_ctl", "score_moments"),
        path / "agent.json",
    )
    if meta["format"] != LEARNER_STATE_FORMAT:
        raise state_io.invalid(path / "agent.json", f"unknown format {meta['format']!r}")
    if meta["learner"] != name:
        raise state_io.invalid(
            path / "agent.json",
            f"it holds a {meta['learner']!r} learner, this seat plays {name!r}",
        )
    policy = state_io.load_tensors(path / "policy.safetensors")
    tensors = state_io.load_tensors(path / "state.safetensors")
    model, optimizer = optimisation.model, optimisation.optimizer
    try:
        if optimisation.sharding is None:
            model.load_policy_state_dict(policy)
        else:
            load_full(model.policy_state_dict(), policy)
    except (RuntimeError, ValueError) as err:
        raise state_io.invalid(
            path / "policy.safetensors", f"weights of a different model: {err}"
        ) from None
    try:
        saved = {k[10:]: v for k, v in tensors.items() if k.startswith("optimizer.")}
        whole = state_io.join_optimizer_state(saved, meta["optimizer"])
        if optimisation.sharding is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            whole = sharded_optimizer_state(whole, params)
        optimizer.load_state_dict(whole)
        sampler.generator.set_state(tensors["rng.sampling"])
        optimisation.shuffle_generator.set_state(tensors["rng.shuffle"])
        shaping.kl_ctl.load_state_dict(meta["kl_ctl"])
        shaping.score_moments.load_state_dict(meta["score_moments"])
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise state_io.invalid(path, f"inconsistent agent state: {err!r}") from None


def process_rng(sampler: TokenSampler, optimisation: Optimisation) -> dict[str, torch.Tensor]:
    """This process's random streams (each process of a run draws its own)."""
    generators = {"sampling": sampler.generator, "shuffle": optimisation.shuffle_generator}
    return {name: generator.get_state() for name, generator in generators.items()}


def load_process_rng(
    states: dict[str, torch.Tensor], sampler: TokenSampler, optimisation: Optimisation
) -> None:
    """Restore what :func:`process_rng` returned."""
    sampler.generator.set_state(states["sampling"])
    optimisation.shuffle_generator.set_state(states["shuffle"])
