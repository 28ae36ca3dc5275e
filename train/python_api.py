"""The Python API that ``cory_rl`` offers (``from cory_rl import make_config, ...``).

    from cory_rl import evaluate, export, make_config, run_training

    config = make_config("smoke", algorithm="cory", run_dir="runs/api")
    run = run_training(config)                # the run folder (metrics, samples, checkpoint)
    report = evaluate(run, max_queries=4)     # the fixed held-out set; writes eval.json/.md
    export(run, "exported/api")               # Hugging Face folders, one per agent

``make_config`` layers the settings as the command line does (defaults < algorithm <
preset < file < the keywords you give); ``TrainConfig`` is the config itself, each field
documented. The game is ``cory_env`` (``cory_env.text_game``); learners are
``cory_rl.agents``. It imports from every layer of ``cory_rl.train``; only ``cory_rl``
imports it. Training is ``run_training``, not ``train``: ``cory_rl.train`` is the package
that holds it, and a function of that name would shadow the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cory_rl.train.config.resolve import build_config
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.run_folder import RunDirectory
from cory_rl.train.evaluation.evaluator import evaluate_run
from cory_rl.train.publish.export import export_run
from cory_rl.train.training import run

__all__ = ["TrainConfig", "evaluate", "export", "make_config", "run_training"]


def make_config(
    preset: str | None = None,
    algorithm: str = "cory",
    file: str | Path | None = None,
    **settings: Any,
) -> TrainConfig:
    """A checked config: ``preset`` (``smoke``, ``cpu``, ``paper-imdb``, ...), a saved
    ``config.yaml`` as ``file``, then any setting by name (``learning_rate=1e-5``,
    ``lam=0``, ``task_settings={...}``), as the flags of ``python train/cory.py``."""
    return build_config(preset, config_file=file, overrides=settings, algorithm=algorithm)


def run_training(config: TrainConfig, resume: str | Path | None = None) -> RunDirectory | None:
    """Train ``config`` (or continue the run folder ``resume``); its run folder, or None
    where there was nothing left to do."""
    return run.run_training(config, Path(resume) if resume is not None else None)


def _path(run: RunDirectory | str | Path) -> Path:
    return run.path if isinstance(run, RunDirectory) else Path(run)


def evaluate(run: RunDirectory | str | Path, **options: Any) -> dict[str, Any]:
    """Every agent of a run in every role on the fixed held-out set (``samples``,
    ``max_queries``, ``seed``, ...: ``python train/evaluate.py --help``); writes the run's
    ``eval.json`` and ``eval.md`` and returns the result."""
    return evaluate_run(_path(run), **options)


def export(run: RunDirectory | str | Path, out: str | Path, merge: bool = False) -> dict:
    """Each agent of a run as a Hugging Face model folder ``out/<agent>`` (``merge``: LoRA
    adapters merged into the weights); returns the folders by agent."""
    return export_run(_path(run), Path(out), merge)
