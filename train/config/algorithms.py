"""The ``--algorithm`` shorthands: which learner takes each seat, with the game's and the
learners' defaults for that setup.

Defaults follow the official scripts where they differ between the PPO baseline and CORY
(``imdb_train/ppo.py``: initial KL coefficient 0.3, no score scaling; ``imdb_train/cory.py``:
0.4, running score scaling and normalisation); both sample with a repetition penalty of
1.1. Elastic Reset takes the rebuttal's eta = 0.001 as its KL coefficient (in the ER
authors' code, eta is the KL penalty coefficient); RLOO and GRPO take TRL 1.16's defaults.
They sit below presets, config files and flags: ``--init_kl_coef 0.1`` still wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NEVER = 10**12
"""A role-exchange period that no run reaches: exchange off."""

SAMPLING = {"repetition_penalty": 1.1}  # both official scripts sample with it
PPO_BASELINE = {"init_kl_coef": 0.3, "score_scaling": False, "score_norm": False, **SAMPLING}
CORY_DEFAULTS = {"init_kl_coef": 0.4, "score_scaling": True, "score_norm": True, **SAMPLING}
# TRL 1.16's RLOOConfig / GRPOConfig defaults: beta 0.05 / 0.0 fixed, one pass per batch.
_TRL_GROUP = {"adaptive_kl": False, "ppo_epochs": 1, "whiten_advantages": False}
RLOO_TRL = {**_TRL_GROUP, "init_kl_coef": 0.05, "kl_penalty": "k1"}
GRPO_TRL = {**_TRL_GROUP, "init_kl_coef": 0.0}


@dataclass(frozen=True)
class Algorithm:
    seat_learner: str
    """The learner of every seat (``--learners`` can change any seat)."""
    n_agents: int
    max_agents: int
    min_agents: int = 1
    game: dict[str, Any] = field(default_factory=dict)
    """Game settings this setup implies (lam, sees, group_size, role exchange)."""
    learner: dict[str, Any] = field(default_factory=dict)
    """Learner setting defaults (each seat takes those its learner has)."""
    picks_by_value: bool = False
    """Whether evaluation also scores the answer of the seat whose critic values it higher
    (the rebuttal's MoE baseline: two independent answers, the higher-valued kept)."""
    description: str = ""


ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm(
        "ppo", 1, 1, learner=PPO_BASELINE, description="single-agent PPO, the paper's baseline"
    ),
    "cory": Algorithm(
        "ppo",
        2,
        8,
        min_agents=2,
        game={"lam": 1.0},
        learner=CORY_DEFAULTS,
        description="PPO agents in the pioneer/observer game: collective reward, role exchange",
    ),
    "reinforce": Algorithm(
        "reinforce",
        1,
        1,
        learner=PPO_BASELINE,
        description="REINFORCE with a baseline and the same per-token KL penalty, no critic",
    ),
    "elastic_reset": Algorithm(
        "elastic_reset",
        1,
        1,
        learner={**PPO_BASELINE, "init_kl_coef": 0.001},
        description="PPO with Elastic Reset: reset to an EMA of itself every reset_freq its",
    ),
    "moe": Algorithm(
        "ppo",
        2,
        2,
        min_agents=2,
        game={"lam": 0.0, "sees": "none", "role_exchange_period": NEVER},
        learner=PPO_BASELINE,
        picks_by_value=True,
        description="two independent PPO agents; evaluation keeps the higher-valued answer",
    ),
    "rloo": Algorithm(
        "rloo",
        1,
        1,
        game={"group_size": 4},
        learner={**PPO_BASELINE, **RLOO_TRL},
        description="REINFORCE leave-one-out: k answers per query, no critic",
    ),
    "grpo": Algorithm(
        "grpo",
        1,
        1,
        game={"group_size": 4},
        learner={**PPO_BASELINE, **GRPO_TRL},
        description="group-normalised advantages with the clipped PPO loss, no critic",
    ),
}


def algorithm_defaults(name: str) -> dict[str, Any]:
    """The config values an algorithm implies, as a layer of settings."""
    algo = ALGORITHMS[name]
    return {"n_agents": algo.n_agents, **algo.game, "learner": dict(algo.learner)}
