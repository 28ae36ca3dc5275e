"""A short ``cpu``-preset training run for the benches that compare two settings of it.

The benches that train the same run twice (``bench_prefix``, ``bench_kl_cost``) differ only
in the task and one learner setting; the rest (a run folder, no reports, no evaluation, no
checkpoint, one mini-batch of the whole batch, forward passes of 16 rows) is this one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def short_training(
    args: argparse.Namespace,
    folder: Path,
    task: dict[str, Any],
    learner: dict[str, Any],
) -> list[dict[str, Any]]:
    """Train ``args.algorithm`` for ``args.iterations`` into ``folder``; its metrics rows.

    ``args`` carries ``algorithm``, ``model``, ``batch_size``, ``iterations`` and ``seed``;
    ``task`` holds the config's task fields (``task``, ``task_settings``, ...) and ``learner``
    the learner settings the bench compares, over the shared ones.
    """
    from cory_rl.train.config.resolve import build_config
    from cory_rl.train.training.run import run_training

    config = build_config(
        "cpu",
        overrides={
            "model": args.model,
            **task,
            "batch_size": args.batch_size,
            "iterations": args.iterations,
            "seed": args.seed,
            "run_dir": str(folder),
            "report_to": ["none"],
            "checkpoint_every": 1000,
            "eval_every": 0,
            "device": "cpu",
            "learner": {
                "mini_batch_size": args.batch_size,
                "forward_batch_size": min(16, args.batch_size),
                **learner,
            },
        },
        algorithm=args.algorithm,
    )
    path = run_training(config).path
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
