"""A trained run, loaded: its config, its game and its learners at the checkpoint's weights.

The one way evaluation, export and play load a run: the checkpoint is found before any
model loads, so a run without one is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cory_env import BatchedTextGame
from cory_rl.agents.base import Learner
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.checkpoint import find_checkpoint, load_learners
from cory_rl.train.core.run_folder import load_run_config


@dataclass
class Trained:
    config: TrainConfig
    game: BatchedTextGame
    learners: dict[str, Learner]
    checkpoint: Path | None
    """The checkpoint folder the learners were loaded from (None: not loaded)."""


def build_trained(
    config: TrainConfig, run_dir: Path | None = None, *, weights: bool = True
) -> Trained:
    """``config``'s game and learners; with ``run_dir``, its checkpoint found first and,
    with ``weights``, loaded (without, the caller loads it later: the base model plays
    first in an evaluation)."""
    checkpoint = find_checkpoint(run_dir) if run_dir is not None else None
    game, learners = build_game_and_learners(config)
    if run_dir is not None and weights:
        checkpoint = load_learners(run_dir, learners)
    return Trained(config, game, learners, checkpoint if weights else None)


def load_trained(
    run_dir: Path, overrides: dict[str, Any] | None = None, *, weights: bool = True
) -> Trained:
    """The run folder's saved config (with ``overrides``), its game and learners at the
    checkpoint's weights."""
    return build_trained(load_run_config(run_dir, overrides), Path(run_dir), weights=weights)
