"""The console commands of ``pyproject.toml`` (``cory-train``, ``cory-eval``, ...).

Each script's ``main`` returns what it made, for tests and notebooks; a console script
hands its function's return value to ``sys.exit``, which prints anything but None or an
int and exits 1. So each command here runs a ``main`` and returns None: exit status 0.
"""

from __future__ import annotations


def train() -> None:
    """``cory-train [--algorithm NAME] ...``: the training scripts as one command. The
    algorithm defaults to ``cory``; a resumed run keeps its own."""
    from cory_rl.train.run import main

    main("cory")


def evaluate() -> None:
    """``cory-eval RUN ...``: train/evaluate.py."""
    from cory_rl.train.evaluate import main

    main()


def export() -> None:
    """``cory-export RUN OUT``: train/export.py."""
    from cory_rl.train.export import main

    main()


def sweep() -> None:
    """``cory-sweep --algorithms ...``: train/sweep.py."""
    from cory_rl.train.sweep import main

    main()


def compare() -> None:
    """``cory-compare RUNS``: train/compare.py."""
    from cory_rl.train.compare import main

    main()


def play() -> None:
    """``cory-play RUN [--query ...]``: train/play.py."""
    from cory_rl.train.play import main

    main()
