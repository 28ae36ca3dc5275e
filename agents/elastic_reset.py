"""Elastic Reset (Noukhovitch et al., NeurIPS 2023) around a PPO learner.

An EMA of the online model's weights follows it: ``ema = decay * ema + (1 - decay) * online``
after every ``learn()``; every ``reset_freq`` calls the online model is reset to the EMA and
the EMA to the initial model. The EMA carries what was learnt across a reset while the reset
pulls the online model back towards the initial one, so drift stays lower for the reward.

What the authors' code does (read, not guessed):

- IMDB, the setup the CORY rebuttal replicates ("decay=0.995, reset_freq=17, eta=0.001"):
  github.com/mnoukhov/RL4LMs, branch ``paper``, config
  ``scripts/training/task_configs/imdb_text_continuation/gpt2_emappo_decay0.995_elasticreset17_kl1.0_coef0.001_eval1.yml``
  (``ema_decay: 0.995``, ``reset_freq: 17``, ``reset_ema: True``, ``kl_div: {coeff: 0.001,
  target_kl: 1.0}``), ``rl4lms/algorithms/ema/ema_ppo.py`` (EMA update once per iteration,
  after ``train()``) and ``rl4lms/envs/text_generation/training_utils.py`` (the resets).
  So **eta = 0.001 is the KL penalty coefficient** (RL4LMs' ``kl_div.coeff``, the initial
  value of its adaptive controller), not a separate parameter: here it is ``init_kl_coef``.
- Reset is of the policy LM only: the optimiser state is kept (``reset_opt`` off), the value
  model/head is kept (``reset_critic`` off) and is not in the EMA, and the KL controller and
  score statistics are untouched. The StackLLaMA code (github.com/mnoukhov/elastic-reset,
  ``stackllama/er_training.py``) agrees: ``torch_ema`` over the LM's trainable (LoRA)
  parameters, "use model.pretrained_model to exclude the value head params", no
  ``num_updates`` warm-up, nothing else reset. So here the EMA holds the trainable LM
  parameters of :meth:`PolicyWithValue.trainable_parameters` minus the value head.
- Two differences from that code, both on purpose: (1) its resets fire at iteration indices
  ``i % reset_freq == 0`` counted from 0 (after the 1st, 18th, 35th update; the StackLLaMA
  code skips i = 0); here after the 17th, 34th, ... call, i.e. every ``reset_freq`` calls.
  (2) In the RL4LMs IMDB code the EMA model *is* the policy's ``_ref_model``
  (``EMAPPO.ema_model = policy._ref_model``, no ``separate_ema_model``), so its KL penalty is
  to the EMA, reset to the initial model at each reset. The paper describes, and the
  StackLLaMA code implements, the KL to the initial model, which is what this learner does
  (the seat's shared frozen reference).

Wraps a :class:`cory_rl.agents.ppo.PPOAgent` (composition): PPO itself is untouched.
Checkpoints add the EMA and the initial weights (safetensors) and the call count (JSON), so
``--resume`` continues exactly, resets included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cory_env import checks
from cory_rl.agents import state_io
from cory_rl.agents.base import Learner
from cory_rl.agents.policy import PolicyWithValue
from cory_rl.agents.ppo import PPOAgent, PPOConfig, make_ppo_agent
from cory_rl.agents.registry import Seat, register_learner
from cory_rl.agents.sharding import full_tensors, load_full

ELASTIC_STATE_FORMAT = 1
"""Version of the files :meth:`ElasticReset.save` adds to PPO's."""


@dataclass
class ElasticResetConfig(PPOConfig):
    """PPO's settings plus the EMA decay and the reset period (defaults: the rebuttal's)."""

    ema_decay: float = 0.995
    """Decay of the EMA of the policy's weights, updated after every ``learn()``:
    ``ema = decay * ema + (1 - decay) * online``."""
    reset_freq: int = 17
    """Reset the policy to the EMA, and the EMA to the initial model, every this many
    ``learn()`` calls (iterations)."""

    where = "elastic_reset"

    def validate(self) -> None:
        super().validate()
        w = "elastic_reset"
        checks.number(self.ema_decay, "ema_decay", minimum=0, maximum=1, where=w)
        checks.integer(self.reset_freq, "reset_freq", minimum=1, where=w)


def reset_parameters(model: PolicyWithValue) -> dict[str, nn.Parameter]:
    """The parameters Elastic Reset averages and resets: the trainable LM ones (with LoRA the
    agent's own adapter), not the value head, by name."""
    head = {id(p) for p in model.value_head.parameters()}
    own = {id(p) for p in model.trainable_parameters()} - head
    return {name: p for name, p in model.named_parameters() if id(p) in own}


@torch.no_grad()
def ema_update_(
    ema: dict[str, torch.Tensor], params: dict[str, torch.Tensor], decay: float
) -> None:
    """ema <- decay * ema + (1 - decay) * params, in place."""
    for name, p in params.items():
        ema[name].mul_(decay).add_(p.detach().to(ema[name].dtype), alpha=1.0 - decay)


@torch.no_grad()
def elastic_reset_(
    params: dict[str, torch.Tensor],
    ema: dict[str, torch.Tensor],
    initial: dict[str, torch.Tensor],
) -> None:
    """The reset, in place: online <- EMA, then EMA <- initial."""
    for name, p in params.items():
        p.copy_(ema[name])
        ema[name].copy_(initial[name])


class ElasticReset(Learner):
    """A PPO learner with Elastic Reset (a :class:`cory_rl.agents.base.Learner`; module doc)."""

    name = "elastic_reset"
    takes_engine = True
    multi_turn = True
    takes_sampling_noise = True
    exportable = True

    def __init__(self, agent: PPOAgent, ema_decay: float, reset_freq: int) -> None:
        agent.name = self.name  # its checkpoint says which learner wrote it
        self.agent = agent
        self.ema_decay = float(ema_decay)
        self.reset_freq = int(reset_freq)
        self.params = reset_parameters(agent.model)
        self.sharding = agent.sharding
        with torch.no_grad():
            self.ema = {n: p.detach().clone() for n, p in self.params.items()}
            # sharded: each process keeps its shard of the initial model, beside its params
            where = None if self.sharding is not None else "cpu"
            self.initial = {n: p.detach().to(where, copy=True) for n, p in self.params.items()}
        self.learn_calls = 0

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.agent.act(obs)

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        self.agent.end_rollout(obs, rewards)

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.agent.turn_stats(obs)

    def use_sampling_noise(self, noise: np.ndarray | None, role: int | None = None) -> None:
        self.agent.use_sampling_noise(noise, role)

    @property
    def seats(self) -> int:  # the Learner capability: PPO's, which plays them
        return self.agent.seats

    @seats.setter
    def seats(self, n: int) -> None:
        self.agent.seats = n

    def attach_engine(self, engine: Any, eos_token_id: int) -> None:
        self.agent.attach_engine(engine, eos_token_id)

    def end_turn(self, num_generated: np.ndarray) -> None:
        self.agent.end_turn(num_generated)

    def has_experience(self) -> bool:  # the Learner capability: PPO's
        return self.agent.has_experience()

    def discard_turn(self) -> None:
        self.agent.discard_turn()

    def turn_over(self) -> None:
        self.agent.turn_over()

    def process_rng(self) -> dict[str, torch.Tensor]:
        return self.agent.process_rng()

    def load_process_rng(self, states: dict[str, torch.Tensor]) -> None:
        self.agent.load_process_rng(states)

    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """The online policy, as PPO exports it (``agents/export.py``)."""
        return self.agent.export(path, tokenizer, merge, info)

    def learn(self) -> dict[str, float]:
        """PPO's update, then the EMA update, then the reset every ``reset_freq`` calls."""
        stats = self.agent.learn()
        self.learn_calls += 1
        ema_update_(self.ema, self.params, self.ema_decay)
        reset = self.learn_calls % self.reset_freq == 0
        if reset:
            elastic_reset_(self.params, self.ema, self.initial)
            self.agent.weights_version += 1
        stats["elastic_reset/reset"] = float(reset)
        return stats

    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """PPO's files, plus ``elastic_reset.safetensors`` (EMA, initial) and ``.json``."""
        path = Path(path)
        self.agent.save(path, writer)
        tensors = {f"ema.{n}": t for n, t in self.ema.items()}
        tensors.update({f"initial.{n}": t for n, t in self.initial.items()})
        if self.sharding is not None:  # every process gathers, the main one writes
            tensors = full_tensors(tensors, keep=self.sharding.is_main)
            if not self.sharding.is_main:
                return
        state_io.save_tensors(tensors, path / "elastic_reset.safetensors", writer)
        state_io.save_json(
            {"format": ELASTIC_STATE_FORMAT, "learn_calls": self.learn_calls},
            path / "elastic_reset.json",
            writer,
        )

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a bad file raises ``CheckpointError`` naming it."""
        path = Path(path)
        self.agent.load(path)
        meta_file, tensor_file = path / "elastic_reset.json", path / "elastic_reset.safetensors"
        meta = state_io.require(state_io.load_json(meta_file), ("format", "learn_calls"), meta_file)
        if meta["format"] != ELASTIC_STATE_FORMAT:
            raise state_io.invalid(meta_file, f"unknown format {meta['format']!r}")
        tensors = state_io.load_tensors(tensor_file)
        expected = {f"{kind}.{n}" for kind in ("ema", "initial") for n in self.params}
        if set(tensors) != expected:
            raise state_io.invalid(
                tensor_file,
                f"it holds the EMA of other parameters than this model's {len(self.params)} "
                f"(differing names, e.g. {sorted(expected ^ set(tensors))[:2]})",
            )
        try:
            targets = {f"ema.{n}": t for n, t in self.ema.items()}
            targets.update({f"initial.{n}": t for n, t in self.initial.items()})
            load_full(targets, tensors)  # each process its own shard, if sharded
            self.learn_calls = int(meta["learn_calls"])
        except (RuntimeError, TypeError, ValueError) as err:
            raise state_io.invalid(tensor_file, f"inconsistent EMA state: {err!r}") from None


@register_learner("elastic_reset", config=ElasticResetConfig)
def make_elastic_reset_agent(seat: Seat) -> ElasticReset:
    """PPO with Elastic Reset: reset to an EMA of itself, the EMA to the initial model."""
    settings = seat.settings
    return ElasticReset(make_ppo_agent(seat), settings.ema_decay, settings.reset_freq)
