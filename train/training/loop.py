"""The one training loop: play a batch of games, let every learner learn, log, checkpoint.

The loop talks to learners only through :class:`cory_rl.agents.base.Learner`, so PPO, CORY and
any other learner share it. One iteration = one batch of ``batch_size`` games.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from cory_env import BatchedTextGame
from cory_env.checks import SettingError
from cory_rl.agents.base import Learner
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.callbacks import Callback, Evaluations, Hooks
from cory_rl.train.core.checkpoint import CheckpointWriter, load_checkpoint
from cory_rl.train.core.distributed import Processes
from cory_rl.train.core.environment import record_environment
from cory_rl.train.core.games import (
    batch_samples,
    check_multi_turn,
    learner_rewards,
    owners,
    play_games,
    seats_of,
)
from cory_rl.train.core.health import Band, HealthWatch
from cory_rl.train.core.memory import reset_rss_peak, rss_peak_mb
from cory_rl.train.core.run_folder import RunDirectory, read_evaluations
from cory_rl.train.core.stopping import EarlyStopping, write_marker


def play_batch(game: BatchedTextGame, learners: dict[str, Learner]) -> None:
    """Play one batch of games to the end and hand every learner its rollout (a learner in
    several seats, the turns of all of them)."""
    play_games(game, learners, collect=True)
    for owner, seats in seats_of(learners).items():
        learners[owner].end_rollout(game.observe(owner), learner_rewards(game, seats))


def play_extra_batches(game: BatchedTextGame, learners: dict[str, Learner]) -> int:
    """Dynamic sampling: play more batches while a learner asks for them (``wants_more``,
    ``agents/dynamic_sampling.py``); the others let those turns go (``discard_turn``) and
    learn from the first batch. The number of extra batches played."""
    extra = 0
    agents = seats_of(learners)
    while wanting := [a for a, learner in owners(learners).items() if learner.wants_more()]:
        game.reset()
        play_games(game, learners, collect=True)
        for owner, seats in agents.items():
            if owner in wanting:
                learners[owner].end_rollout(game.observe(owner), learner_rewards(game, seats))
            else:
                learners[owner].discard_turn()
        extra += 1
    return extra


def learn(learners: dict[str, Learner]) -> dict[str, dict[str, float]]:
    """Every learner's update, once each; a learner's statistics under each seat it plays."""
    stats = {}
    for owner, seats in seats_of(learners).items():
        if not learners[owner].has_experience():  # every turn empty: nothing to learn
            stats.update(dict.fromkeys(seats, {}))
            continue
        learned = learners[owner].learn()
        stats.update(dict.fromkeys(seats, learned))
    return {agent: stats[agent] for agent in learners}


def reset_peak_memory() -> None:
    """Start a run's peak from what is resident now (cory_rl.train.core.memory), on CUDA too."""
    reset_rss_peak()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb() -> float:
    """Peak resident memory since the run started (and CUDA's peak allocation, if used)."""
    rss = rss_peak_mb()
    if torch.cuda.is_available():
        rss = max(rss, torch.cuda.max_memory_allocated() / 2**20)
    return float(rss)


def iteration_metrics(
    game: BatchedTextGame, stats: dict[str, dict[str, float]], eta: float
) -> dict[str, float]:
    """Per agent and per role: task score, KL, and the combined objective ``r - eta*KL``."""
    row: dict[str, Any] = {}
    roles = game.roles
    kls = []
    for agent, agent_stats in stats.items():
        score = float(np.mean(game.scores[agent]))
        kl = agent_stats.get("objective/kl")  # a learner without a reference reports none
        for prefix in (agent, roles[agent]):
            row[f"{prefix}/score"] = score
            if kl is not None:
                row[f"{prefix}/kl"] = float(kl)
                row[f"{prefix}/objective"] = score - eta * float(kl)
        if kl is not None:
            kls.append(float(kl))
        row[f"{agent}/role"] = roles[agent]
        row.update({f"{agent}/{k}": v for k, v in agent_stats.items()})
    row["score_mean"] = float(np.mean([np.mean(s) for s in game.scores.values()]))
    row.update({f"game/{k}": v for k, v in game.match_stats().items()})  # a refereed game's
    if kls:
        row["kl_mean"] = float(np.mean(kls))
    return row


def evaluation_due(config: TrainConfig, iteration: int) -> bool:
    """Whether an evaluation along training follows the update of ``iteration``."""
    last = iteration == config.iterations - 1
    return bool(config.eval_every) and (last or (iteration + 1) % config.eval_every == 0)


def train(
    config: TrainConfig,
    learners: dict[str, Learner],
    game: BatchedTextGame,
    run_path: Path,
    resume: bool = False,
    processes: Processes | None = None,
    callbacks: Sequence[Callback] = (),
    checkpoints: CheckpointWriter | None = None,
    evaluations: Callable[[Path], Evaluations] | None = None,
    plots: Callable[[Path], object] | None = None,
) -> RunDirectory | None:
    """Run ``config.iterations`` iterations (continuing from the checkpoint if ``resume``).

    Under ``accelerate launch`` every process runs this loop on its own games; logged
    numbers are means over all processes and only the main process writes files (the
    others get None back). ``callbacks`` see every phase and row (:class:`Callback`);
    ``checkpoints`` writes the checkpoints (default: a new :class:`CheckpointWriter`,
    which writes while the next rollout plays). ``evaluations(run_path)`` makes the
    held-out evaluations along training that the main process runs when ``eval_every``
    asks (``cory_rl.train.evaluation.along``); ``plots(run_path)`` draws the run's figures
    at the end.
    """
    processes = processes or Processes()
    check_multi_turn(game, learners)
    restarts, exchange_period = config.restart_on_exchange, game.settings.role_exchange_period
    if restarts:
        lacking = [a for a, learner in learners.items() if not learner.can_restart]
        if lacking:
            raise SettingError(
                f"restart_on_exchange: the learners of {lacking} have no restart(); "
                "set restart_on_exchange false or seat LLM learners there"
            )
    reset_peak_memory()  # the run's own peak, not an earlier run's in this process (a sweep)
    hooks = Hooks(callbacks)
    main = processes.is_main
    start = load_checkpoint(run_path, learners, game, processes) if resume else 0
    tensorboard = "tensorboard" in config.report_to
    run = RunDirectory(run_path, first_iteration=start, tensorboard=tensorboard) if main else None
    if run is not None:
        if resume:
            run.truncate_logs(start)
        config.save(run.path / "config.yaml")  # on resume too: --iterations may have changed
        record_environment(run.path, start, game)  # where this stretch of the run ran
    bar = tqdm(
        range(start, config.iterations),
        initial=start,
        total=config.iterations,
        desc=f"{config.algorithm} {config.task}",
        unit="it",
        dynamic_ncols=True,
        disable=not main,
    )
    checkpoints = checkpoints or CheckpointWriter()
    along = None
    health = HealthWatch(Band(config.health_approx_kl, config.health_clipfrac))
    warned = False
    stopping = EarlyStopping.of(config)
    if stopping.enabled and main and start > 0:  # the evaluations before the checkpoint
        for row in read_evaluations(run_path):
            stopping.add(row)

    def log(row: dict[str, Any]) -> None:
        run.log_metrics(row)
        hooks.on_row(row)

    # The main process evaluates and the others go on; sharded, every process plays the
    # evaluation (each forward gathers weights from all of them) and the main one writes.
    sharded = any(learner.sharding is not None for learner in learners.values())
    if config.eval_every and evaluations is not None and (main or sharded):
        along = evaluations(run_path)
        along.writes = main
        with hooks.phase("evaluation", start):
            first = along.begin(learners, start)
        if first is not None and run is not None:
            log(first)
    try:
        for iteration in bar:
            t0 = time.perf_counter()
            with hooks.phase("rollout", iteration):
                game.reset(seed=processes.game_seed(config.seed) if iteration == 0 else None)
                play_batch(game, learners)
                play_extra_batches(game, learners)
            t_play = time.perf_counter() - t0
            with hooks.phase("checkpoint", iteration):
                checkpoints.wait()  # learning changes the weights the last checkpoint writes
            with hooks.phase("learn", iteration):
                if restarts and iteration > 0 and iteration % exchange_period == 0:
                    for learner in owners(learners).values():
                        learner.restart()
                stats = learn(learners)
            elapsed = time.perf_counter() - t0
            row = {
                "iteration": iteration,
                **iteration_metrics(game, stats, config.eta),
                "time/iteration_s": elapsed,
                "time/rollout_s": t_play,
                "memory/peak_mb": peak_memory_mb(),
            }
            row = processes.mean_numbers(row)
            row["games"] = game.batch_size * processes.num
            health.add(row)
            if not warned and health.unhealthy():  # once it has enough updates to judge
                warned = True  # once, early enough to stop a run that cannot count
                if main:
                    tqdm.write(f"{health.warning(so_far=True)}\n{health.summary()}")
            if run is not None:
                with hooks.phase("logging", iteration):
                    log(row)
                    if iteration % config.sample_every == 0 or iteration == config.iterations - 1:
                        samples = batch_samples(game, config.n_samples)
                        run.log_samples(iteration, samples)
                        hooks.on_samples(iteration, samples)
            reason = None
            if along is not None and along.due(iteration):
                with hooks.phase("evaluation", iteration):
                    evaluated = along.after(iteration, learners)
                if run is not None:
                    log(evaluated)
                    reason = stopping.add(evaluated)
            if stopping.enabled and evaluation_due(config, iteration):
                reason = processes.broadcast(reason)  # every process stops with the main one
            last = iteration == config.iterations - 1 or reason is not None
            if (iteration + 1) % config.checkpoint_every == 0 or last:
                with hooks.phase("checkpoint", iteration):
                    checkpoints.save(run_path, learners, game, iteration, processes)
            kl_mean = row.get("kl_mean")
            bar.set_postfix(
                score=f"{row['score_mean']:+.3f}",
                kl="n/a" if kl_mean is None else f"{kl_mean:.3f}",
                s_it=f"{elapsed:.1f}",
            )
            if reason is not None:
                if main:
                    write_marker(run_path, iteration + 1, reason)
                    tqdm.write(f"early stopping: {reason}")
                break
    finally:
        bar.close()
        with hooks.phase("final checkpoint write", config.iterations):
            checkpoints.wait()  # on an error too: the last checkpoint lands before the run ends
        if run is not None:
            run.close()
    if run is not None and plots is not None:
        with hooks.phase("plots", config.iterations):
            plots(run.path)
    return run
