"""The console commands of ``pyproject.toml`` (``cory-train``, ``cory-eval``, ...).

Each command's ``main`` returns what it made, for tests and notebooks; a console script
hands its function's return value to ``sys.exit``, which prints anything but None or an
int and exits 1. So each command here runs a ``main`` and returns None: exit status 0.
The imports are inside the functions so that one command does not import every other's
dependencies (``cory-compare`` needs no torch).
"""

from __future__ import annotations

import sys


def train() -> None:
    """``cory-train [--algorithm NAME] ...``: the training scripts as one command. The
    algorithm defaults to ``cory``; a resumed run keeps its own."""
    from cory_rl.train.config import allocator

    allocator.relaunch_for(sys.argv[1:])  # first: a re-execution then repeats no import
    from cory_rl.train.commands.train import main

    main("cory")


def evaluate() -> None:
    """``cory-eval RUN ...``: ``python train/evaluate.py``."""
    from cory_rl.train.commands.evaluate import main

    main()


def export() -> None:
    """``cory-export RUN OUT``: ``python train/export.py``."""
    from cory_rl.train.commands.export import main

    main()


def sweep() -> None:
    """``cory-sweep --algorithms ...``: ``python train/sweep.py``."""
    from cory_rl.train.commands.sweep import main

    main()


def compare() -> None:
    """``cory-compare RUNS``: ``python train/compare.py``."""
    from cory_rl.train.commands.compare import main

    main()


def play() -> None:
    """``cory-play RUN [--query ...]``: ``python train/play.py``."""
    from cory_rl.train.commands.play import main

    main()


def plots() -> None:
    """``cory-plots RUN ...``: ``python train/plots.py``."""
    from cory_rl.train.commands.plots import main

    main()


def health() -> None:
    """``cory-health RUN_OR_FOLDER ...``: each run's update health."""
    from cory_rl.train.commands.health import main

    main()


def tune() -> None:
    """``cory-tune PILOTS --setting learning_rate``: a setting per algorithm from pilots."""
    from cory_rl.train.commands.tuning import main

    main()


def frontier() -> None:
    """``cory-frontier RESULTS --setting init_kl_coef``: each arm's frontier over a setting."""
    from cory_rl.train.commands.frontier import main

    main()


def eval_saved() -> None:
    """``cory-eval-saved SAVED --like RUN ...``: evaluate model folders saved elsewhere."""
    from cory_rl.train.commands.eval_saved import main

    main()
