"""cory_rl: CORY, PPO and their relatives on your own models, from one import.

    from cory_rl import evaluate, export, make_config, run_training

    run = run_training(make_config("smoke", algorithm="cory", run_dir="runs/api"))
    evaluate(run, max_queries=4)
    export(run, "exported/api")

What each does: ``cory_rl.train.python_api``. Every ``import cory_rl.agents...`` runs this
package first, so it imports the API on first use only (PEP 562): a learner's import does
not import training.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainConfig", "evaluate", "export", "make_config", "run_training"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'cory_rl' has no attribute {name!r}")
    from cory_rl.train import python_api

    return getattr(python_api, name)


def __dir__() -> list[str]:
    return sorted(__all__)
