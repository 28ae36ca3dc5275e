"""The training command: ``python train/cory.py``, ``train/ppo.py`` and ``cory-train``.

Its steps, in order: settle the heap allocator from the raw command line (one re-execution,
before anything is parsed), parse and check the flags into a config, and train it
(:func:`cory_rl.train.training.run.run_training`); a user's mistake ends in one line.
"""

from __future__ import annotations

import sys

from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config import allocator
from cory_rl.train.core.distributed import die_with_launcher
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.run_folder import RunDirectory
from cory_rl.train.training.run import run_training


def main(algorithm: str, argv: list[str] | None = None) -> RunDirectory | None:
    """Train from command-line flags (``argv`` None: this process's own, after settling
    the allocator). A bad setting, folder, data file, reward or checkpoint exits with one
    line."""
    if argv is None:
        allocator.relaunch_for(sys.argv[1:])
    die_with_launcher()
    config, resume = parse_args(argv, algorithm=algorithm)
    if argv is None and config.allocator == "mimalloc" and allocator.in_use() != "mimalloc":
        allocator.relaunch(config.allocator, lean=config.activation_checkpointing)  # a file's
    try:
        return run_training(config, resume)
    except USER_ERRORS as err:  # the run's last checkpoint, if any, is on disk
        raise SystemExit(one_line(err)) from None
