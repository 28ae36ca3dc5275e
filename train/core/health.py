"""Whether a run's updates were small enough for its results to count.

PPO's clipped objective is a trust region only while each update stays near the policy
that acted: language-model PPO is normally run at a per-token ``approx_kl`` of about
0.01-0.05 and a ``clipfrac`` of about 0.05-0.2. Past that, the ratio is clipped on much of
the batch and the reward curve no longer says what the algorithm does. The learners log
both per agent (``<agent>/<learner>/approx_kl``, ``.../clipfrac``); this module reads the
rows and says when too many updates were outside the band, and what moves them back.

``cory-health RUN_OR_FOLDER ...`` (``cory_rl.train.commands.health``) prints the health of
every run found there (run folders or compact results, ``cory_rl.train.core.results``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cory_rl.train.core.run_folder import read_metrics

UNHEALTHY_SHARE = 0.25
"""A run warns when more than this share of its updates is outside the band."""
MIN_UPDATES = 10
"""Updates per agent before the share means something: a smoke run's three (the first from
the untouched model) would warn on one update's chance."""
SETTINGS = (
    "a lower --learning_rate, a larger --mini_batch_size (with --batch_size), fewer "
    "--ppo_epochs, or --target_kl 0.02 (stop each update's epochs early)"
)
"""What moves an update back inside the band, in the order to try them."""


@dataclass(frozen=True)
class Band:
    """The healthy band: an update's mean ``approx_kl`` and ``clipfrac`` at most these."""

    approx_kl: float = 0.05
    clipfrac: float = 0.2

    def holds(self, approx_kl: float, clipfrac: float | None) -> bool:
        return approx_kl <= self.approx_kl and (clipfrac is None or clipfrac <= self.clipfrac)


@dataclass
class AgentHealth:
    """One agent's updates so far: each one's ``approx_kl`` and ``clipfrac`` (None where the
    learner clips nothing, as REINFORCE) and the optimiser steps each took."""

    approx_kl: list[float] = field(default_factory=list)
    clipfrac: list[float | None] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    unhealthy: int = 0

    @property
    def updates(self) -> int:
        return len(self.approx_kl)

    @property
    def unhealthy_share(self) -> float:
        return self.unhealthy / self.updates if self.updates else 0.0

    def medians(self) -> tuple[float, float | None]:
        clipped = [c for c in self.clipfrac if c is not None]
        return (
            statistics.median(self.approx_kl),
            statistics.median(clipped) if clipped else None,
        )


def update_stats(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per agent, the update statistics in one metrics row: ``approx_kl``, ``clipfrac`` and
    ``steps`` where logged (keys ``<agent>/<learner>/approx_kl``, ``<agent>/update/steps``)."""
    out: dict[str, dict[str, float]] = {}
    for key, value in row.items():
        parts = key.split("/")
        if len(parts) != 3 or not isinstance(value, (int, float)):
            continue
        agent, group, name = parts
        if name in ("approx_kl", "clipfrac") and group not in ("update", "eval"):
            out.setdefault(agent, {})[name] = float(value)
        elif group == "update" and name == "steps":
            out.setdefault(agent, {})["steps"] = float(value)
    return {agent: stats for agent, stats in out.items() if "approx_kl" in stats}


class HealthWatch:
    """Reads rows as they are logged and keeps every agent's :class:`AgentHealth`."""

    def __init__(self, band: Band | None = None) -> None:
        self.band = band or Band()
        self.agents: dict[str, AgentHealth] = {}

    def add(self, row: dict[str, Any]) -> None:
        for agent, stats in update_stats(row).items():
            health = self.agents.setdefault(agent, AgentHealth())
            health.approx_kl.append(stats["approx_kl"])
            health.clipfrac.append(stats.get("clipfrac"))
            if "steps" in stats:
                health.steps.append(stats["steps"])
            health.unhealthy += not self.band.holds(stats["approx_kl"], stats.get("clipfrac"))

    def add_all(self, rows: Iterable[dict[str, Any]]) -> HealthWatch:
        for row in rows:
            self.add(row)
        return self

    @property
    def updates(self) -> int:
        return sum(h.updates for h in self.agents.values())

    @property
    def unhealthy_share(self) -> float:
        unhealthy = sum(h.unhealthy for h in self.agents.values())
        return unhealthy / self.updates if self.updates else 0.0

    @property
    def judged(self) -> bool:
        """Every agent has made :data:`MIN_UPDATES` updates: enough to judge the run by."""
        return bool(self.agents) and all(h.updates >= MIN_UPDATES for h in self.agents.values())

    def unhealthy(self) -> bool:
        """More than :data:`UNHEALTHY_SHARE` of the agents' updates outside the band, once
        there are enough of them to judge (:attr:`judged`)."""
        return self.judged and self.unhealthy_share > UNHEALTHY_SHARE

    def summary(self) -> str:
        """One line per agent: median approx_kl and clipfrac, the share outside the band."""
        lines = []
        for agent, health in sorted(self.agents.items()):
            kl, clip = health.medians()
            clip_text = "n/a" if clip is None else f"{clip:.3f}"
            steps = f", {statistics.mean(health.steps):.1f} steps" if health.steps else ""
            lines.append(
                f"  {agent:<8} approx_kl median {kl:.4f}, clipfrac median {clip_text}{steps}; "
                f"{health.unhealthy}/{health.updates} updates outside the band"
            )
        return "\n".join(lines)

    def warning(self, so_far: bool = False) -> str | None:
        """What to say when the run's updates were too large; None when they were not."""
        if not self.unhealthy():
            return None
        which = "the updates so far were" if so_far else "the run's updates were"
        return (
            f"warning: {self.unhealthy_share:.0%} of {which} outside the "
            f"healthy band (approx_kl <= {self.band.approx_kl:g}, clipfrac <= "
            f"{self.band.clipfrac:g} per token): the policy moves far from the one that acted, "
            f"so rewards and KLs are not PPO's. Try {SETTINGS}."
        )


def run_health(rows: Iterable[dict[str, Any]], band: Band | None = None) -> tuple[bool, str]:
    """Whether a finished run's updates count (judged, at most :data:`UNHEALTHY_SHARE` of
    them outside the band, both medians over every agent's updates inside it) and one line
    that says why: the rule a study states before its runs."""
    watch = HealthWatch(band).add_all(rows)
    kls = [k for h in watch.agents.values() for k in h.approx_kl]
    if not kls:
        return False, "no update statistics logged"
    clips = [c for h in watch.agents.values() for c in h.clipfrac if c is not None]
    kl, clip = statistics.median(kls), statistics.median(clips) if clips else 0.0
    healthy = (
        watch.judged
        and watch.unhealthy_share <= UNHEALTHY_SHARE
        and kl <= watch.band.approx_kl
        and clip <= watch.band.clipfrac
    )
    text = (
        f"approx_kl median {kl:.3f}, clipfrac median {clip:.3f}, "
        f"{watch.unhealthy_share:.0%} outside"
    )
    return healthy, text


def health_table(paths: list[Path], band: Band | None = None) -> str:
    """A markdown table, one row per run found under ``paths``: its updates (agent x
    iteration), the medians over them and the share outside ``band``."""
    runs = sorted(
        {
            m.parent
            for p in paths
            for pattern in ("metrics.jsonl", "metrics.jsonl.gz")
            for m in (
                [Path(p) / pattern] if (Path(p) / pattern).is_file() else Path(p).rglob(pattern)
            )
        }
    )
    band = band or Band()
    lines = [
        f"| run | updates | approx_kl median | clipfrac median | outside the band "
        f"(approx_kl > {band.approx_kl:g} or clipfrac > {band.clipfrac:g}) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        watch = HealthWatch(band).add_all(read_metrics(run))
        if not watch.updates:
            continue
        kls = [k for h in watch.agents.values() for k in h.approx_kl]
        clips = [c for h in watch.agents.values() for c in h.clipfrac if c is not None]
        clip = f"{statistics.median(clips):.3f}" if clips else "n/a"
        lines.append(
            f"| {run} | {watch.updates} | {statistics.median(kls):.3f} | {clip} | "
            f"{watch.unhealthy_share:.0%} |"
        )
    return "\n".join(lines)
