"""The learner protocol: what any player of the game (LLM or not) must offer the loop.

The training loop and evaluation talk to learners through these six methods only, so any
learner can take any seat of ``cory_env``'s batched game. One *rollout* is one batch of
B games::

    game.reset()
    while not game.done:
        agent = game.agent_selection
        game.step(learners[agent].act(game.observe(agent)), agent=agent)
    for agent, learner in learners.items():
        learner.end_rollout(game.observe(agent), game.rewards[agent])
    stats = {agent: learner.learn() for agent, learner in learners.items()}

Evaluation plays the same games without ``end_rollout`` (so nothing is collected) and asks
each learner for ``turn_stats(game.observe(agent))``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Learner(Protocol):
    """A seat-agnostic learner; the role comes in ``obs["role"]`` (0 = pioneer)."""

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """One token id per game (shape ``(B,)``) for a batched observation."""

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        """The batch of games ended: this seat's final observation and rewards ``(B,)``."""

    def learn(self) -> dict[str, float]:
        """Update from what was collected since the last call; return scalar statistics."""

    def save(self, path: Path) -> None:
        """Write everything needed to resume into the folder ``path``.

        A learner may also take a keyword ``writer`` (an ``agents.state_io.WriteQueue``)
        and queue its file writes there (``state_io.save_tensors``/``save_json`` take it):
        the loop then writes the checkpoint in the background while the next rollout
        plays. Without it, the learner's files are written during the call.
        """

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote."""

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-game statistics of this seat's last turn, for evaluation (``{}`` if none).

        LLM learners give ``kl`` (summed KL to their reference), ``logprob`` (summed),
        ``entropy`` (mean per token) and ``value`` (the critic's estimate at the answer's
        last token, which the MoE baseline uses to pick an answer); each of shape (B,).
        ``obs`` is the seat's final observation (its ``num_generated`` masks the turn).
        """


PROTOCOL_METHODS = ("act", "end_rollout", "learn", "save", "load", "turn_stats")


@runtime_checkable
class CommonNoise(Protocol):
    """A learner that can sample with given uniforms (evaluation's common random numbers)."""

    def use_sampling_noise(self, noise: np.ndarray | None) -> None:
        """Draw row b's t-th token with the uniform ``noise[b, t]`` (inverse CDF of the
        distribution it samples from); None returns to the learner's own stream."""


@runtime_checkable
class Exportable(Protocol):
    """A learner whose policy can leave as a standard Hugging Face model (LLM learners)."""

    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """Write the policy into the new folder ``path``; ``merge`` folds LoRA adapters in."""


class RandomLearner:
    """Uniformly random tokens; a baseline and a check that the loop is learner-agnostic."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self.rollouts = 0

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.rng.integers(0, self.vocab_size, size=len(obs["input_ids"]))

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        self.rollouts += 1

    def learn(self) -> dict[str, float]:
        return {}

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        np.save(Path(path) / "rng.npy", np.array([self.rollouts]))

    def load(self, path: Path) -> None:
        self.rollouts = int(np.load(Path(path) / "rng.npy")[0])

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}
