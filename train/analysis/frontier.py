"""A frontier over a setting (the paper's Fig. 2): each arm's held-out (KL, reward) as one
setting (the KL coefficient) varies, read from the evaluations along training of runs that
differ only in the algorithm, that setting and the seed.

Four tables, each with its CSV (``cory-frontier RESULTS --setting init_kl_coef``):

* ``frontier_runs``: per arm and value, the final evaluation's KL and reward over seeds
  (t-intervals), the updates and why each run stopped, its update health, and the collapse
  signals at the end. A run whose updates left the band is listed and not counted.
* ``frontier_matched``: an arm's frontier at KL x is, per seed, the best held-out reward
  any of its counted runs reached at a KL of at most x (its evaluations, and its trajectory
  read linearly between them, where it crosses x). Over the KLs that every seed of both
  arms reaches: mean over seeds with the t-interval, the difference to the baseline arm
  with Welch's test, its p-value Holm-adjusted over the KLs.
* ``frontier_knob``: per arm and seed, the held-out KL at each value of the setting at the
  last evaluation all of that seed's runs reached, and whether it falls strictly as the
  value grows: whether the knob (a KL coefficient) holds the KL at all.
* ``collapse_along``: per arm, value and evaluation, the mean over seeds of the KL, reward,
  entropy, pooled distinct-2, repetition (tokens and words), EOS rate (1 - the share of
  answers that hit the token budget) and answer length: where a policy collapses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cory_rl.train.analysis.tuning import setting_of
from cory_rl.train.core import stopping
from cory_rl.train.core.health import Band, run_health
from cory_rl.train.core.run_folder import evaluations_along, load_run_config, read_metrics
from cory_rl.train.evaluation import inference, measures, report

SIGNALS = (
    "kl",
    "reward",
    "entropy",
    "distinct_2_pooled",
    "repetitive",
    "repetitive_words",
    "eos_rate",
    "length",
)
"""What each evaluation along training gives, per point (``eval_point``)."""


@dataclass
class Arm:
    """One run of a frontier: its arm, the setting's value, its seed, health and evaluations."""

    path: Path
    algorithm: str
    value: float
    seed: int
    iterations: int
    healthy: bool
    health: str
    stop: dict[str, Any] | None
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    """Per evaluation along training: ``updates`` and every one of :data:`SIGNALS`."""

    @property
    def ending(self) -> str:
        """Why the run ended: its early stop, all its updates, or not yet."""
        if self.stop:
            return f"stopped after {self.stop['updates']}: {self.stop['reason']}"
        done = self.evaluations[-1]["updates"]
        if done >= self.iterations:
            return f"all {self.iterations} updates"
        return f"unfinished ({done} of {self.iterations} updates evaluated)"

    @property
    def trajectory(self) -> list[tuple[float, float]]:
        return [(e["kl"], e["reward"]) for e in self.evaluations]


def eval_point(evaluation: dict[str, Any], point: str) -> dict[str, Any] | None:
    """The numbers of one evaluation at ``point``, pooled over every answer there: a role
    (each agent's plays in it, as the stopping rule and ``cory-compare`` read it), ``all``,
    an agent (its plays in every role) or ``AGENT/ROLE`` (one agent in one role: each of
    CORY's two policies as pioneer). The trained model's answers, or the untouched model's
    before the first update; None where the evaluation has none at ``point``."""
    answers = evaluation["answers"]
    models = list(dict.fromkeys(answers["model"]))
    if not models:
        return None
    model = "trained" if "trained" in models else models[0]
    if point == "all" or point in answers["role"]:
        picked = report.point_rows(answers, model, point)
    else:
        agent, _, role = point.partition("/")
        picked = report.rows_where(answers, model=model, agent=agent, role=role or None)
    if not len(picked):
        return None
    row = report.cell_metrics(answers, picked, measures.ETAS, checked=False, base=None)
    return {
        "updates": int(evaluation["updates"]),
        "kl": float(row["kl"]["mean"]),
        "reward": float(row["reward"]["mean"]),
        "entropy": row["entropy"],
        "distinct_2_pooled": row["distinct_2_pooled"],
        "repetitive": row["repetitive"],
        "repetitive_words": row["repetitive_words"],
        "eos_rate": 1.0 - row["hit_budget"],
        "length": row["length"],
    }


def read_arm(path: Path, setting: str, point: str, band: Band | None = None) -> Arm:
    config = load_run_config(path)
    healthy, health = run_health(read_metrics(path), band)
    evaluations = [
        e for e in (eval_point(ev, point) for ev in evaluations_along(path)) if e is not None
    ]
    if not evaluations:
        raise ValueError(
            f"{path}: no evaluation along training at {point!r}; train with --eval_every, "
            "or name another --point"
        )
    return Arm(
        path,
        config.algorithm,
        setting_of(config, setting),
        int(config.seed),
        int(config.iterations),
        healthy,
        health,
        stopping.stopped(path),
        sorted(evaluations, key=lambda e: e["updates"]),
    )


def best_within(trajectories: list[list[tuple[float, float]]], kl: float) -> float | None:
    """The best reward on any of the trajectories at a KL of at most ``kl``: an evaluation's,
    or a segment's where it crosses ``kl``; None where none gets that low."""
    found = []
    for points in trajectories:
        found += [r for k, r in points if k <= kl]
        for (k0, r0), (k1, r1) in zip(points, points[1:], strict=False):
            if min(k0, k1) < kl < max(k0, k1):
                found.append(r0 + (kl - k0) / (k1 - k0) * (r1 - r0))
    return max(found) if found else None


def frontier_kls(arms: list[Arm], count: int = 5) -> list[float]:
    """``count`` KLs, evenly up to the largest KL that every counted seed of every arm
    reached, from the smallest at which every one of them has a point."""
    span = kl_reach(arms)
    if span is None or span[1] <= span[0]:
        return []
    low, high = span
    return [float(f"{low + (high - low) * (i + 1) / count:.3g}") for i in range(count)]


def kl_reach(arms: list[Arm]) -> tuple[float, float] | None:
    """The KLs every counted seed of every arm has reached: from the smallest at which each
    has a point to the largest each reached; None without trajectories."""
    reach = seed_trajectories(arms)
    if not reach:
        return None
    lows = [min(k for t in ts for k, _ in t) for seeds in reach.values() for ts in seeds.values()]
    highs = [max(k for t in ts for k, _ in t) for seeds in reach.values() for ts in seeds.values()]
    return max(lows), min(highs)


def kl_notes(arms: list[Arm], kls: list[float]) -> list[str]:
    """A line for each asked KL outside what every counted seed reached (why: its rows
    then count fewer seeds, or read a seed's best below the KL as at it)."""
    span = kl_reach(arms)
    if span is None:
        return []
    low, high = span
    where = f"outside the KLs every counted seed reached ({low:g} to {high:g})"
    notes = []
    for kl in kls:
        if kl < low:
            notes.append(
                f"frontier: --at_kl {kl:g} is {where}; seeds with no point that low drop out"
            )
        elif kl > high:
            notes.append(
                f"frontier: --at_kl {kl:g} is {where}; a seed that stopped below it counts its "
                "best reward at a lower KL"
            )
    return notes


def seed_trajectories(arms: list[Arm]) -> dict[str, dict[int, list[list[tuple[float, float]]]]]:
    """Per algorithm and seed, the trajectories of its counted (healthy) runs."""
    out: dict[str, dict[int, list[list[tuple[float, float]]]]] = {}
    for arm in arms:
        if arm.healthy:
            out.setdefault(arm.algorithm, {}).setdefault(arm.seed, []).append(arm.trajectory)
    return out


def pick_baseline(algorithms: list[str], name: str | None) -> str:
    if name is None:
        return "ppo" if "ppo" in algorithms else algorithms[0]
    if name not in algorithms:
        raise ValueError(f"--baseline {name!r} is not an arm here; arms: {algorithms}")
    return name


def matched_rows(arms: list[Arm], kls: list[float], baseline: str) -> list[dict[str, Any]]:
    """Per KL and arm: its seeds' frontier rewards over seeds, and the test against the
    baseline arm at that KL (Holm over the KLs, per arm)."""
    by_seed = seed_trajectories(arms)

    def at(algorithm: str, kl: float) -> list[float]:
        values = (best_within(ts, kl) for ts in by_seed.get(algorithm, {}).values())
        return [v for v in values if v is not None]

    rows = []
    for kl in kls:
        base = at(baseline, kl)
        for algorithm in sorted(by_seed):
            values = at(algorithm, kl)
            if not values:
                continue
            t = inference.t_interval(values)
            other = algorithm != baseline and base
            welch = inference.welch_test(values, base) if other else None
            rows.append(
                {
                    "kl": kl,
                    "algorithm": algorithm,
                    "seeds": len(values),
                    "reward": t["mean"],
                    "std": t["std"],
                    "reward_ci_low": (t["ci"] or [None])[0],
                    "reward_ci_high": (t["ci"] or [None, None])[1],
                    "baseline": baseline,
                    "diff": t["mean"] - float(np.mean(base)) if other else None,
                    "welch_ci_low": welch["ci"][0] if welch else None,
                    "welch_ci_high": welch["ci"][1] if welch else None,
                    "welch_p": welch["p"] if welch else None,
                    "detectable": welch["detectable"] if welch else None,
                }
            )
    for algorithm in by_seed:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        for row, adjusted in zip(mine, inference.holm([r["welch_p"] for r in mine]), strict=True):
            row["welch_p_holm"] = adjusted
    return rows


def _cells(arms: list[Arm]) -> dict[tuple[str, float], list[Arm]]:
    cells: dict[tuple[str, float], list[Arm]] = {}
    for arm in sorted(arms, key=lambda a: (a.algorithm, a.value, a.seed)):
        cells.setdefault((arm.algorithm, arm.value), []).append(arm)
    return cells


def _mean(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return float(np.mean(known)) if known else None


def run_rows(arms: list[Arm]) -> list[dict[str, Any]]:
    """Per arm and value: the final evaluation over its counted seeds (t-intervals of KL and
    reward, the collapse signals' means), and every seed's updates, stop and health."""
    rows = []
    for (algorithm, value), members in _cells(arms).items():
        counted = [a for a in members if a.healthy]
        last = [a.evaluations[-1] for a in counted]
        kl = inference.t_interval([e["kl"] for e in last]) if last else None
        reward = inference.t_interval([e["reward"] for e in last]) if last else None
        row: dict[str, Any] = {
            "algorithm": algorithm,
            "value": value,
            "seeds": len(members),
            "counted": len(counted),
            "updates": " ".join(str(a.evaluations[-1]["updates"]) for a in members),
            "stopped": "; ".join(f"seed {a.seed}: {a.ending}" for a in members),
            "health": "; ".join(
                f"seed {a.seed}: {a.health}" + ("" if a.healthy else " (not counted)")
                for a in members
            ),
        }
        for name, t in (("kl", kl), ("reward", reward)):
            row[name] = t["mean"] if t else None
            row[f"{name}_ci_low"] = (t["ci"] or [None])[0] if t else None
            row[f"{name}_ci_high"] = (t["ci"] or [None, None])[1] if t else None
        for signal in SIGNALS[2:]:
            row[signal] = _mean([e[signal] for e in last])
        rows.append(row)
    return rows


def knob_rows(arms: list[Arm]) -> list[dict[str, Any]]:
    """Per arm and seed: the KL at every value, read at the last number of updates that all
    of the seed's runs (counted or not) evaluated, and whether it falls strictly as the
    value grows (None with fewer than two values)."""
    seeds: dict[tuple[str, int], list[Arm]] = {}
    for arm in sorted(arms, key=lambda a: (a.algorithm, a.seed, a.value)):
        seeds.setdefault((arm.algorithm, arm.seed), []).append(arm)
    rows = []
    for (algorithm, seed), members in seeds.items():
        common = set.intersection(*({e["updates"] for e in a.evaluations} for a in members))
        updates = max(common) if common else None
        kls = [
            next((e["kl"] for e in a.evaluations if e["updates"] == updates), None) for a in members
        ]
        falls = None
        if updates is not None and len(members) > 1:
            falls = all(b < a for a, b in zip(kls, kls[1:], strict=False))
        rows.append(
            {
                "algorithm": algorithm,
                "seed": seed,
                "updates": updates,
                "values": [a.value for a in members],
                "kls": kls,
                "falls": falls,
                "healthy": all(a.healthy for a in members),
            }
        )
    return rows


def collapse_rows(arms: list[Arm]) -> list[dict[str, Any]]:
    """Per arm, value and number of updates: every signal's mean over the seeds evaluated
    there (all runs, counted or not: collapse is what an unhealthy run shows first)."""
    rows = []
    for (algorithm, value), members in _cells(arms).items():
        updates = sorted({e["updates"] for a in members for e in a.evaluations})
        for u in updates:
            at = [e for a in members for e in a.evaluations if e["updates"] == u]
            row = {"algorithm": algorithm, "value": value, "updates": u, "seeds": len(at)}
            row.update({s: _mean([e[s] for e in at]) for s in SIGNALS})
            rows.append(row)
    return rows
