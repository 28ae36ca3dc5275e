"""Train a config: check its folder and trackers, build its game and learners, hand them to
the loop with evaluations along the way, then write the run's summary."""

from __future__ import annotations

import time
from pathlib import Path

from cory_env.checks import SettingError
from cory_rl.train.analysis.run_plots import plot_run
from cory_rl.train.analysis.run_summary import run_summary, summary_values
from cory_rl.train.config.tracker_checks import prepare_trackers
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.build import build_game_and_learners, launched_with_fsdp, make_accelerator
from cory_rl.train.core.checkpoint import checkpoint_updates
from cory_rl.train.core.distributed import Processes, die_with_launcher
from cory_rl.train.core.health import Band
from cory_rl.train.core.run_folder import RunDirectory, RunLock, check_run_path, clear_stale_run
from cory_rl.train.core.stopping import MARKER, stopped
from cory_rl.train.evaluation.along import TrainingEvaluations
from cory_rl.train.training.loop import train
from cory_rl.train.training.trackers import Trackers


def default_run_dir(config: TrainConfig) -> Path:
    return Path("runs") / f"{config.algorithm}-{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_training(config: TrainConfig, resume_dir: Path | None = None) -> RunDirectory | None:
    """Train a config; under ``accelerate launch`` each process calls this (see loop.train).

    The main process holds the run folder's lock (:class:`RunLock`) until the run ends: at
    once where the folder exists (a live run's folder is refused before anything loads),
    else from when the run writes it. Nothing is written before the checks pass."""
    die_with_launcher()
    run_path = Path(resume_dir or config.run_dir or default_run_dir(config))
    stale = check_run_path(run_path, resume=resume_dir is not None)
    accelerator = make_accelerator(config)
    processes = Processes(accelerator)
    if processes.num > 1 and config.run_dir is None and resume_dir is None:
        raise SettingError(
            "several processes need one --run_dir (a time-stamped default "
            "could differ between them)"
        )
    locks: list[RunLock] = []
    if processes.is_main and run_path.is_dir():
        locks.append(RunLock(run_path))
    try:
        return _train_in(config, run_path, resume_dir, processes, accelerator, locks, stale)
    finally:
        for lock in locks:
            lock.release()


def _train_in(
    config: TrainConfig,
    run_path: Path,
    resume_dir: Path | None,
    processes: Processes,
    accelerator: object,
    locks: list[RunLock],
    stale: bool,
) -> RunDirectory | None:
    """The run, once its folder is known to take it (``locks``: the main process's lock of
    the folder, taken here where it is new; ``stale``: the folder holds a run that stopped
    before its first checkpoint, cleared once the models have loaded)."""
    sharded = config.sharding == "fsdp2" or (
        config.sharding == "auto" and launched_with_fsdp() is not None
    )
    if processes.num > 1 and config.lora and config.game.n_agents > 1 and not sharded:
        raise SettingError(
            "lora with several seats shares one base model between the agents, which "
            "data-parallel training (DDP) cannot wrap; shard it (--sharding fsdp2, or "
            "accelerate launch --config_file train/configs/fsdp2.yaml), run it in one "
            "process, or train without lora"
        )
    if processes.num > 1 and config.rollout_engine != "none" and config.vllm_mode != "server":
        raise SettingError(
            f"rollout_engine: {config.rollout_engine!r} runs its engine inside the one "
            "training process; under accelerate launch use vllm_mode server (a vllm serve "
            "all processes share) or rollout_engine none"
        )
    if resume_dir is not None and (stop := stopped(run_path)) is not None:
        print(
            f"nothing to do: {run_path} stopped by its early-stopping rule after "
            f"{stop['updates']} updates ({stop['reason']}); to train on regardless, delete "
            f"{run_path / MARKER} and resume"
        )
        return None
    if resume_dir is not None:
        done = checkpoint_updates(run_path)
        if done >= config.iterations:
            print(
                f"nothing to do: {run_path} has done {done} iterations and --iterations is "
                f"{config.iterations}; raise --iterations to train further"
            )
            return None
    if processes.is_main:
        for note in prepare_trackers(config.report_to, run_path):
            print(note)
    game, learners = build_game_and_learners(config, accelerator)
    if processes.is_main:
        if not locks:
            locks.append(RunLock(run_path))  # makes the folder
        if stale:
            clear_stale_run(run_path)
    processes.wait()  # the others start once the folder is theirs
    trackers = Trackers(config, run_path) if processes.is_main else None
    run = train(
        config,
        learners,
        game,
        run_path,
        resume_dir is not None,
        processes,
        callbacks=[trackers] if trackers is not None else [],
        evaluations=lambda path: TrainingEvaluations(config, game.tokenizers, path),
        plots=plot_run,
    )
    if run is not None:
        summary = run_summary(run.path, Band(config.health_approx_kl, config.health_clipfrac))
        print(summary)
        values = summary_values(run.path)
        run.log_summary(values, summary, config.iterations - 1)
        if trackers is not None:
            trackers.finish(values)
    processes.close()
    return run
