"""Pick a setting per algorithm from pilot runs, by a training-side rule stated in advance.

The rule (as the paper tuned each method's learning rate): among the values whose pilot
updates were healthy (``cory_rl.train.core.health``: judged, at most a quarter of the updates
outside the band, and both medians inside it), the one with the highest mean of a training
number (default ``pioneer/score``) over the pilot's last ``last`` iterations; a value within
``tie`` of the best loses to a smaller one. Held-out evaluations play no part, so the
comparison that follows is not tuned on what it measures.

    cory-tune PILOTS --setting learning_rate [--by pioneer/score] [--last 10] [--tie 0.01]
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cory_rl.train.core.health import Band, run_health
from cory_rl.train.core.run_folder import load_run_config, read_metrics


@dataclass(frozen=True)
class Pilot:
    """One pilot run: its algorithm, the setting's value, its health and its number."""

    path: Path
    algorithm: str
    value: float
    healthy: bool
    health: str
    score: float


def setting_of(config: Any, setting: str) -> float:
    """A setting's value in a run's config: a learner setting, or a top-level one."""
    if setting in config.learner:
        return float(config.learner[setting])
    if not hasattr(config, setting):
        raise ValueError(
            f"--setting {setting!r} is neither a learner setting nor a run setting; name the "
            "one the runs vary, as the sweep's --setting did (learning_rate, init_kl_coef, ...)"
        )
    return float(getattr(config, setting))


def read_pilot(path: Path, setting: str, by: str, last: int, band: Band) -> Pilot:
    config = load_run_config(path)
    rows = read_metrics(path)
    healthy, health = run_health(rows, band)
    values = [float(r[by]) for r in rows[-last:] if by in r]
    if not values:
        raise ValueError(f"{path}: its metrics have no {by!r}; name another with --by")
    return Pilot(
        path,
        config.algorithm,
        setting_of(config, setting),
        healthy,
        health,
        statistics.mean(values),
    )


def pick(pilots: list[Pilot], tie: float) -> dict[str, Pilot | None]:
    """Per algorithm, the pilot the rule picks (None where no value was healthy)."""
    picked: dict[str, Pilot | None] = {}
    for algorithm in sorted({p.algorithm for p in pilots}):
        healthy = [p for p in pilots if p.algorithm == algorithm and p.healthy]
        if not healthy:
            picked[algorithm] = None
            continue
        best = max(p.score for p in healthy)
        picked[algorithm] = min(
            (p for p in healthy if p.score >= best - tie), key=lambda p: p.value
        )
    return picked


def table(
    pilots: list[Pilot], picked: dict[str, Pilot | None], setting: str, by: str, last: int
) -> str:
    lines = [
        f"| algorithm | {setting} | healthy | health | {by}, last {last} | picked |",
        "|---|---|---|---|---|---|",
    ]
    for p in sorted(pilots, key=lambda p: (p.algorithm, p.value)):
        mark = "yes" if picked.get(p.algorithm) is p else ""
        lines.append(
            f"| {p.algorithm} | {p.value:g} | {'yes' if p.healthy else 'no'} | "
            f"{p.health} | {p.score:+.3f} | {mark} |"
        )
    return "\n".join(lines)
