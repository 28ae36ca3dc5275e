"""Play a task with a model (the base, or the agents of a finished run) and report scores.

python train/evaluate.py --task arith --batches 2             # the embedded base model
python train/evaluate.py --run runs/cory-imdb-...             # a run's trained agents
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np


def evaluate(
    config: Any, batches: int, run_dir: Path | None = None, seed: int = 1234, show: int = 3
) -> dict[str, Any]:
    """Mean task score and KL per agent and per role over ``batches`` batches, and samples.

    Learners are reached through the protocol only: ``act`` to play, ``turn_stats`` for
    what evaluation measures. For ``moe`` the answer with the higher value estimate of
    the two agents is kept per query, and its score is reported as ``score_moe``.
    """
    from train.checkpoint import find_checkpoint
    from train.loop import batch_samples, play_games
    from train.run import build_game_and_learners

    game, learners = build_game_and_learners(config)
    if run_dir is not None:
        folder = find_checkpoint(run_dir)
        for agent, learner in learners.items():
            learner.load(folder / agent)
    by_agent: dict[str, list[float]] = {a: [] for a in game.possible_agents}
    kl_by_agent: dict[str, list[float]] = {a: [] for a in game.possible_agents}
    by_role: dict[str, list[float]] = {}
    moe: list[float] = []
    samples: list[dict[str, Any]] = []
    for i in range(batches):
        game.reset(seed=seed if i == 0 else None)
        play_games(game, learners)  # no end_rollout: nothing is collected or learned
        stats = {a: learners[a].turn_stats(game.observe(a)) for a in game.possible_agents}
        for agent, role in game.roles.items():
            by_agent[agent].extend(game.scores[agent].tolist())
            by_role.setdefault(role, []).extend(game.scores[agent].tolist())
            kl_by_agent[agent].extend(stats[agent].get("kl", []))
        if config.algorithm == "moe":
            values = np.stack([stats[a]["value"] for a in game.possible_agents])
            scores = np.stack([game.scores[a] for a in game.possible_agents])
            moe.extend(scores[values.argmax(axis=0), np.arange(game.batch_size)].tolist())
        samples.extend(batch_samples(game, show) if i == 0 else [])
    result = {
        "task": config.task,
        "algorithm": config.algorithm,
        "games": batches * game.batch_size,
        "score_by_agent": {a: float(np.mean(s)) for a, s in by_agent.items()},
        "kl_by_agent": {a: float(np.mean(k)) for a, k in kl_by_agent.items() if k},
        "score_by_role": {r: float(np.mean(s)) for r, s in by_role.items()},
        "samples": samples,
    }
    if moe:
        result["score_moe"] = float(np.mean(moe))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from agents.state_io import CheckpointError
    from cory_env.checks import SettingError
    from train.algorithms import ALGORITHMS
    from train.config import _flag_value, build_config, load_config_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run folder: evaluate its checkpoint")
    parser.add_argument("--algorithm", default="cory", choices=sorted(ALGORITHMS))
    parser.add_argument("--task", help="task (default: the run's, else imdb)")
    parser.add_argument("--model", help="model (default: the run's, else embedded)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=_flag_value)
    parser.add_argument("--task_settings", type=_flag_value, default=None)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--show", type=int, default=3, help="sample exchanges to print")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"batch_size": args.batch_size}
    overrides["ppo"] = {"mini_batch_size": args.batch_size}
    for key in ("task", "model", "max_new_tokens", "task_settings"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    config_file = args.run / "config.yaml" if args.run else None
    algorithm = args.algorithm
    try:
        if config_file is not None:
            if not config_file.is_file():
                parser.error(f"--run {args.run}: not a run folder (it has no config.yaml)")
            algorithm = load_config_file(config_file).get("algorithm", algorithm)
        config = build_config(config_file=config_file, overrides=overrides, algorithm=algorithm)
        result = evaluate(config, args.batches, args.run, args.seed, args.show)
    except (SettingError, FileNotFoundError, CheckpointError) as err:
        parser.error(str(err))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
