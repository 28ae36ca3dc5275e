"""The console commands of ``pyproject.toml`` (``cory-train``, ``cory-eval``, ...).

Each script's ``main`` returns what it made, for tests and notebooks; a console script
hands its function's return value to ``sys.exit``, which prints anything but None or an
int and exits 1. So each command here runs a ``main`` and returns None: exit status 0.
"""

from __future__ import annotations


def train() -> None:
    """``cory-train [--algorithm NAME] ...``: the training scripts as one command. The
    algorithm defaults to ``cory``; a resumed run keeps its own."""
    from train.run import main

    main("cory")


def evaluate() -> None:
    """``cory-eval RUN ...``: train/evaluate.py."""
    from train.evaluate import main

    main()


def export() -> None:
    """``cory-export RUN OUT``: train/export.py."""
    from train.export import main

    main()


def sweep() -> None:
    """``cory-sweep --algorithms ...``: train/sweep.py."""
    from train.sweep import main

    main()


def compare() -> None:
    """``cory-compare RUNS``: train/compare.py."""
    from train.compare import main

    main()


def play() -> None:
    """``cory-play RUN [--query ...]``: train/play.py."""
    from train.play import main

    main()
