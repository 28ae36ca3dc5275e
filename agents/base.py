"""The learner interface: what any player of the game (LLM or not) offers the loop.

The training loop and evaluation talk to learners through :class:`Learner` only (six
required methods, and optional capabilities with defaults), so any learner can take any
seat of ``cory_env``'s batched game. One *rollout* is one batch of B games::

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
from typing import Any

import numpy as np


class Learner:
    """A seat-agnostic learner; the role comes in ``obs["role"]`` (0 = pioneer).

    Subclass it: the six methods below are required (they raise until defined), and the
    optional capabilities after them have defaults that do nothing, as TRL's
    ``TrainerCallback`` hooks do. A learner overrides only the capabilities it has; the
    training loop, evaluation, checkpoints and engines call every one of them and never ask
    whether a learner has a method.
    """

    # ------------------------------------------------------------------ required
    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """One token id per game (shape ``(B,)``) for a batched observation."""
        raise NotImplementedError(f"{type(self).__name__} must define act()")

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        """The batch of games ended: this seat's final observation and rewards: ``(B,)`` in
        a game of one round, ``(B, rounds)`` (one column per turn, in order) in a game of
        several, whose turns :meth:`end_turn` announced; there NaN marks a turn of a round
        the game did not score (it paid nothing: ``pay_every_round`` false)."""
        raise NotImplementedError(f"{type(self).__name__} must define end_rollout()")

    def learn(self) -> dict[str, float]:
        """Update from what was collected since the last call; return scalar statistics."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    def save(self, path: Path, writer: Any = None) -> None:
        """Write everything needed to resume into the folder ``path``.

        ``writer`` (a ``cory_rl.agents.state_io.WriteQueue``, or None) may take the file
        writes: ``state_io.save_tensors``/``save_json`` queue them there, and the loop
        writes the checkpoint in the background while the next rollout plays. A learner
        may ignore it and write its files during the call.
        """
        raise NotImplementedError(f"{type(self).__name__} must define save()")

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote."""
        raise NotImplementedError(f"{type(self).__name__} must define load()")

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-game statistics of this seat's last turn, for evaluation (``{}`` if none).

        LLM learners give ``kl`` (summed KL to their reference), ``logprob`` (summed),
        ``entropy`` (mean per token) and ``value`` (the critic's estimate at the answer's
        last token, which the MoE baseline uses to pick an answer); each of shape (B,).
        ``obs`` is the seat's final observation (its ``num_generated`` masks the turn).
        """
        raise NotImplementedError(f"{type(self).__name__} must define turn_stats()")

    # ------------------------------------------------------------------ optional capabilities
    sharding: Any = None
    """The FSDP2 sharding of this learner's policy (``agents/sharding.py``); None = whole on
    every process. Sharded learners make every process evaluate and save together."""

    can_restart: bool = False
    """Whether :meth:`restart` is defined (``restart_on_exchange`` needs it on every seat)."""

    takes_engine: bool = False
    """Whether :meth:`attach_engine` is defined (a vLLM engine plays such a seat's turns)."""

    multi_turn: bool = False
    """Whether it learns from several turns an episode (a game of ``rounds`` > 1, or
    several seats)."""

    seats: int = 1
    """How many seats of the game it plays, set by the run's builder: more than one is
    parameter sharing (``learners: {llm_1: llm_0}``), which needs ``multi_turn``: it hears
    of every turn's end, gets the rewards of all its turns in one ``end_rollout`` and learns,
    saves and exports once."""

    def end_turn(self, num_generated: np.ndarray) -> None:
        """In a game of several rounds, or for a learner in several seats, one of its turns
        ended, with ``num_generated`` tokens (B,) of each row accepted; the game moves on (to
        this learner again, maybe). Not called for a learner in one seat of a game of one
        round."""

    def turn_over(self) -> None:
        """The game moved on from this seat's turn (a sharded learner frees its weights)."""

    def discard_turn(self) -> None:
        """Let the finished turn go: a batch the loop played for another seat's dynamic
        sampling, which this seat does not learn from."""

    def wants_more(self) -> bool:
        """Dynamic sampling: whether this seat wants another batch before it learns."""
        return False

    def has_experience(self) -> bool:
        """Whether the batch gave this seat anything to learn from: not when every one of
        its turns was empty (a refereed match over before its turn); the loop then skips
        its update."""
        return True

    def restart(self) -> None:
        """A fresh optimiser and KL state at a role exchange (``can_restart``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart (can_restart False)")

    def attach_engine(self, engine: Any, eos_token_id: int) -> None:
        """Take whole turns from a rollout engine (``takes_engine``)."""
        raise NotImplementedError(f"{type(self).__name__} takes no engine (takes_engine False)")

    takes_sampling_noise: bool = False
    """Whether :meth:`use_sampling_noise` draws with the uniforms it is given (evaluation's
    common random numbers: base and trained models answer with the same draws)."""

    def use_sampling_noise(self, noise: np.ndarray | None, role: int | None = None) -> None:
        """Draw row b's t-th token with the uniform ``noise[b, t]`` (inverse CDF of the
        distribution it samples from); None returns to the learner's own stream. With
        ``role`` (given to a learner in several seats only), in that role's turns only. By
        default ignored (``takes_sampling_noise`` False): the learner draws its own."""

    exportable: bool = False
    """Whether :meth:`export` writes the policy as a standard Hugging Face model (LLM
    learners); evaluation calls an exportable learner's untrained policy the base model."""

    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """Write the policy into the new folder ``path``; ``merge`` folds LoRA adapters in."""
        name = type(self).__name__
        raise NotImplementedError(f"{name} has no policy to export (exportable False)")

    def process_rng(self) -> dict[str, Any]:
        """This process's own random streams, saved per process by a checkpoint."""
        return {}

    def load_process_rng(self, states: dict[str, Any]) -> None:
        """Restore what :meth:`process_rng` returned."""


REQUIRED_METHODS = ("act", "end_rollout", "learn", "save", "load", "turn_stats")
"""What a :class:`Learner` subclass must define."""


class RandomLearner(Learner):
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

    def save(self, path: Path, writer: Any = None) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        np.save(Path(path) / "rng.npy", np.array([self.rollouts]))

    def load(self, path: Path) -> None:
        self.rollouts = int(np.load(Path(path) / "rng.npy")[0])

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}
