"""An LLM learner's persistence: its state saved and loaded exactly, and its policy
exported as a Hugging Face model folder.

A part of :class:`agents.llm.LLMLearner`, kept apart by job.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cory_rl.agents import state_io
from cory_rl.agents.export import export_policy
from cory_rl.agents.sharding import (
    full_optimizer_state,
    full_tensors,
    load_full,
    sharded_optimizer_state,
)

LEARNER_STATE_FORMAT = 1
"""Version of the files :meth:`LLMLearner.save` writes."""


class SavedState:
    """Save, load and export of :class:`agents.llm.LLMLearner` (module doc)."""

    # ------------------------------------------------------------------ persistence
    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """The policy as a Hugging Face model folder plus its value head (agents/export.py)."""
        return export_policy(self.model, tokenizer, path, merge, info)

    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """Weights, optimiser and RNG states as safetensors; the rest as JSON, written last
        (or queued on ``writer``, in that order).

        Sharded, every process calls it: the full tensors are gathered on every process
        (``agents/sharding.py``), and the main one writes them, as one process would."""
        path = Path(path)
        policy, optimizer = self.model.policy_state_dict(), self.optimizer.state_dict()
        if self.sharding is not None:
            main = self.sharding.is_main
            policy, optimizer = full_tensors(policy, main), full_optimizer_state(optimizer, main)
            if not main:
                return
        path.mkdir(parents=True, exist_ok=True)
        state_io.save_tensors(policy, path / "policy.safetensors", writer)
        optimizer_tensors, optimizer_rest = state_io.split_optimizer_state(optimizer)
        tensors = {f"optimizer.{k}": v for k, v in optimizer_tensors.items()}
        tensors["rng.sampling"] = self.generator.get_state()
        tensors["rng.shuffle"] = self.shuffle_generator.get_state()
        state_io.save_tensors(tensors, path / "state.safetensors", writer)
        state_io.save_json(
            {
                "format": LEARNER_STATE_FORMAT,
                "learner": self.name,
                "optimizer": optimizer_rest,
                "kl_ctl": self.kl_ctl.state_dict(),
                "score_moments": self.score_moments.state_dict(),
                "config": asdict(self.config),
            },
            path / "agent.json",
            writer,
        )

    def process_rng(self) -> dict[str, torch.Tensor]:
        """This process's random streams (each process of a run draws its own)."""
        generators = {"sampling": self.generator, "shuffle": self.shuffle_generator}
        return {name: generator.get_state() for name, generator in generators.items()}

    def load_process_rng(self, states: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(states["sampling"])
        self.shuffle_generator.set_state(states["shuffle"])

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a bad file raises ``CheckpointError`` naming it."""
        path = Path(path)
        if not (path / "agent.json").exists() and (path / "agent.pt").exists():
            raise state_io.invalid(
                path / "agent.pt",
                "a pickled checkpoint of an older version; pickles can run code, so they are "
                "never loaded",
            )
        meta = state_io.require(
            state_io.load_json(path / "agent.json"),
            ("format", "optimizer", "kl_ctl", "score_moments"),
            path / "agent.json",
        )
        if meta["format"] != LEARNER_STATE_FORMAT:
            raise state_io.invalid(path / "agent.json", f"unknown format {meta['format']!r}")
        if meta.get("learner", self.name) != self.name:
            raise state_io.invalid(
                path / "agent.json",
                f"it holds a {meta['learner']!r} learner, this seat plays {self.name!r}",
            )
        policy = state_io.load_tensors(path / "policy.safetensors")
        tensors = state_io.load_tensors(path / "state.safetensors")
        self.weights_version += 1
        try:
            if self.sharding is None:
                self.model.load_policy_state_dict(policy)
            else:
                load_full(self.model.policy_state_dict(), policy)
        except (RuntimeError, ValueError) as err:
            raise state_io.invalid(
                path / "policy.safetensors", f"weights of a different model: {err}"
            ) from None
        try:
            optimizer = {k[10:]: v for k, v in tensors.items() if k.startswith("optimizer.")}
            whole = state_io.join_optimizer_state(optimizer, meta["optimizer"])
            if self.sharding is not None:
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
                whole = sharded_optimizer_state(whole, params)
            self.optimizer.load_state_dict(whole)
            self.generator.set_state(tensors["rng.sampling"])
            self.shuffle_generator.set_state(tensors["rng.shuffle"])
            self.kl_ctl.load_state_dict(meta["kl_ctl"])
            self.score_moments.load_state_dict(meta["score_moments"])
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            raise state_io.invalid(path, f"inconsistent agent state: {err!r}") from None
