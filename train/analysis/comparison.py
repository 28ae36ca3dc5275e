"""Runs read back and compared: seeds grouped, series and spreads, and the statistics of
every table ``train/compare.py`` writes (summary, comparisons, matched KL). No figures."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cory_rl.train.config.files import write_beside
from cory_rl.train.core import results
from cory_rl.train.core.run_folder import (
    final_evaluation,
    load_run_config,
    read_evaluations,
    read_metrics,
)
from cory_rl.train.evaluation import inference, measures

IGNORED = ("seed", "run_dir", "report_to")
"""Settings in which runs of one group may differ (where logs go changes no result)."""


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    """The final held-out evaluation (format 2), if the run has one."""
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    """The ``metrics.jsonl`` rows of its evaluations along training, by updates."""


@dataclass
class Group:
    """Runs that differ only in the seed."""

    label: str
    algorithm: str
    runs: list[Run]


def run_folders(paths: list[Path]) -> list[Path]:
    """Run folders: each path that holds a ``config.yaml``, else its subfolders that do."""
    found: list[Path] = []
    for path in paths:
        if (path / "config.yaml").is_file():
            found.append(path)
            continue
        inner = sorted(p for p in path.glob("*") if (p / "config.yaml").is_file())
        if not inner:
            raise FileNotFoundError(f"{path} is neither a run folder nor holds run folders")
        found += inner
    return found


def load_run(path: Path) -> Run:
    # Resolved as a run's config is everywhere: numbers in their declared types (a
    # lora_alpha saved as 32.0 is 32), and a setting added after the run was saved at its
    # default, whose behaviour the run had.
    config = load_run_config(path).to_dict()
    has_metrics = results.exists(path / "metrics.jsonl")
    return Run(
        path,
        config,
        read_metrics(path) if has_metrics else [],
        final_evaluation(path),
        read_evaluations(path) if has_metrics else [],
    )


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (``learner.init_kl_coef``), values as JSON text."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key != "task_settings":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
    return flat


def group_runs(runs: list[Run]) -> list[Group]:
    """Group runs whose configs agree on everything but ``IGNORED``, in first-seen order.

    A group is labelled by its algorithm and the settings that vary between the groups of
    that algorithm (``cory init_kl_coef=0.1``).
    """
    keyed: dict[str, list[Run]] = {}
    flats: dict[str, dict[str, Any]] = {}
    for run in runs:
        flat = {k: v for k, v in flatten(run.config).items() if k not in IGNORED}
        key = json.dumps(flat, sort_keys=True)
        keyed.setdefault(key, []).append(run)
        flats[key] = flat
    groups = []
    for key, members in keyed.items():
        algorithm = str(members[0].config.get("algorithm", "?"))
        peers = [f for k, f in flats.items() if json.loads(f.get("algorithm", '""')) == algorithm]
        varying = sorted(k for k in set().union(*peers) if len({p.get(k) for p in peers}) > 1)
        parts = [f"{k.split('.')[-1]}={plain(flats[key].get(k))}" for k in varying]
        groups.append(Group(" ".join([algorithm, *parts]), algorithm, members))
    return groups


def plain(text: str | None) -> str:
    return "-" if text is None else str(json.loads(text))


# ----------------------------------------------------------------------------- curves
def series(run: Run, key: str, eta: float | None) -> dict[int, float]:
    """``{iteration: value}`` of one metric; ``objective`` recomputed when ``eta`` is given."""
    prefix, quantity = key.rsplit("/", 1)
    out = {}
    for row in run.rows:
        if quantity == "objective" and eta is not None:
            score, kl = row.get(f"{prefix}/score"), row.get(f"{prefix}/kl")
            if score is not None and kl is not None:
                out[int(row["iteration"])] = score - eta * kl
        elif key in row:
            out[int(row["iteration"])] = float(row[key])
    return out


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value): the band of a curve."""
    t = inference.t_interval(values)
    return t["mean"], t["std"] or 0.0


def seed_spread(group: Group, key: str, eta: float | None) -> list[dict[str, Any]]:
    """Per iteration: mean, std, min and max over the group's seeds that logged it."""
    per_run = [series(run, key, eta) for run in group.runs]
    iterations = sorted(set().union(*per_run))
    table = []
    for it in iterations:
        values = [s[it] for s in per_run if it in s]
        mean, std = spread(values)
        table.append(
            {
                "iteration": it,
                "mean": mean,
                "std": std,
                "min": float(min(values)),
                "max": float(max(values)),
                "seeds": len(values),
            }
        )
    return table


def series_prefixes(groups: list[Group], kind: str) -> list[str]:
    keys = {
        k.split("/")[0]
        for g in groups
        for r in g.runs
        for row in r.rows
        for k in row
        if k.endswith("/score")
    }
    if kind == "agents":
        return sorted(k for k in keys if k.startswith("llm_"))
    return sorted((k for k in keys if not k.startswith("llm_")), key=lambda r: (r != "pioneer", r))


# ----------------------------------------------------------------------------- frontier
def frontier_rows(groups: list[Group], point: str) -> list[dict[str, Any]]:
    """One row per evaluated run: its test KL and reward at ``point`` (a role or ``all``),
    ``on_front`` when no run of its algorithm has lower KL and higher reward."""
    rows = []
    for group in groups:
        for run in group.runs:
            summary = ((run.evaluation or {}).get("summary") or {}).get("trained", {})
            cell = summary.get(point)
            if cell is None or "kl" not in cell:
                continue
            rows.append(
                {
                    "run": str(run.path),
                    "group": group.label,
                    "algorithm": group.algorithm,
                    "seed": run.config.get("seed"),
                    "point": point,
                    "kl": cell["kl"],
                    "reward": cell["reward"],
                    **{
                        f"r - {eta:g} KL": cell["reward"] - eta * cell["kl"]
                        for eta in measures.ETAS
                    },
                }
            )
    for algorithm in {r["algorithm"] for r in rows}:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        front = set(measures.pareto_front([(r["kl"], r["reward"]) for r in mine]))
        for i, r in enumerate(mine):
            r["on_front"] = i in front
    return rows


def reference_points(groups: list[Group], point: str) -> list[tuple[float, float]]:
    """The base model's (KL, reward) from each evaluation that has one, deduplicated."""
    seen = set()
    for group in groups:
        for run in group.runs:
            cell = ((run.evaluation or {}).get("summary") or {}).get("reference", {}).get(point)
            if cell and "kl" in cell:
                seen.add((round(cell["kl"], 9), round(cell["reward"], 9)))
    return sorted(seen)


def summary_rows(groups: list[Group], point: str) -> list[dict[str, Any]]:
    """Per group, over its evaluated seeds: test reward, base reward, the paired difference
    (each seed's mean over queries of reward - base), test KL and distinct-2."""
    rows = []
    for group in groups:
        cells = [c for run in group.runs if (c := cell(run, "trained", point)) is not None]
        if not cells:
            continue
        row: dict[str, Any] = {
            "group": group.label,
            "algorithm": group.algorithm,
            "seeds": len(cells),
            "answers_per_seed": min(c["n"] for c in cells),
        }
        values = {
            "reward": [c["reward"] for c in cells],
            "reward_minus_base": [
                c["reward_minus_base"]["mean"] for c in cells if c.get("reward_minus_base")
            ],
            "kl": [c.get("kl", math.nan) for c in cells],
            "distinct_2": [c["distinct_2"] for c in cells if c.get("distinct_2") is not None],
            "distinct_2_pooled": [
                c["distinct_2_pooled"] for c in cells if c.get("distinct_2_pooled") is not None
            ],
        }
        for name, vals in values.items():
            if not vals:
                continue
            t = inference.t_interval(vals)
            row[f"{name}_mean"], row[f"{name}_std"] = t["mean"], t["std"]
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = t["ci"] or (None, None)
        rows.append(row)
    return rows


def cell(run: Run, model: str, point: str) -> dict[str, Any] | None:
    return (((run.evaluation or {}).get("summary") or {}).get(model) or {}).get(point)


# ----------------------------------------------------------------------------- comparisons
def per_query_rewards(run: Run, point: str) -> dict[int, float] | None:
    """The trained agents' mean held-out reward per query at ``point`` (a role or all)."""
    answers = (run.evaluation or {}).get("answers")
    if not answers:
        return None
    rows = [
        i
        for i, (m, r) in enumerate(zip(answers["model"], answers["role"], strict=True))
        if m == "trained" and point in ("all", r)
    ]
    if not rows:
        return None
    units, means = inference.per_unit_means(
        [answers["query"][i] for i in rows], [answers["reward"][i] for i in rows]
    )
    return dict(zip(units.tolist(), means.tolist(), strict=True))


def query_bootstrap(group: Group, baseline: Group, point: str) -> dict[str, Any] | None:
    """The difference of two groups per query (each query's reward averaged over the
    group's seeds), with its bootstrap interval over queries; None unless every run of
    both answered one and the same evaluation set."""
    sets = {
        json.dumps((r.evaluation or {}).get("eval_set"), sort_keys=True)
        for r in (*group.runs, *baseline.runs)
    }
    if len(sets) != 1:
        return None
    means = []
    for g in (group, baseline):
        per_run = [q for run in g.runs if (q := per_query_rewards(run, point)) is not None]
        if not per_run:
            return None
        shared = sorted(set.intersection(*(set(q) for q in per_run)))
        means.append({u: float(np.mean([q[u] for q in per_run])) for u in shared})
    units = sorted(set(means[0]) & set(means[1]))
    diffs = [means[0][u] - means[1][u] for u in units]
    if not diffs:
        return None
    return {
        "mean": float(np.mean(diffs)),
        "ci": inference.bootstrap_ci(diffs),
        "queries": len(units),
    }


def comparison_rows(groups: list[Group], baseline: Group, point: str) -> list[dict[str, Any]]:
    """Each group's test reward against the baseline's: Welch over seeds, bootstrap over
    queries."""
    rows = []
    base = [c["reward"] for run in baseline.runs if (c := cell(run, "trained", point))]
    for group in groups:
        if group is baseline:
            continue
        mine = [c["reward"] for run in group.runs if (c := cell(run, "trained", point))]
        if not mine or not base:
            continue
        welch = inference.welch_test(mine, base)
        boot = query_bootstrap(group, baseline, point)
        rows.append(
            {
                "group": group.label,
                "baseline": baseline.label,
                "point": point,
                "seeds": len(mine),
                "baseline_seeds": len(base),
                "diff": float(np.mean(mine) - np.mean(base)),
                "welch_ci_low": welch["ci"][0] if welch else None,
                "welch_ci_high": welch["ci"][1] if welch else None,
                "welch_p": welch["p"] if welch else None,
                "welch_df": welch["df"] if welch else None,
                "query_diff": boot["mean"] if boot else None,
                "query_ci_low": (boot["ci"] or [None])[0] if boot else None,
                "query_ci_high": (boot["ci"] or [None, None])[1] if boot else None,
                "queries": boot["queries"] if boot else None,
            }
        )
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    write_beside(path, write)


def run_points(run: Run) -> set[str]:
    """The points a run's evaluations report: its roles, agents and ``all``."""
    summary = (run.evaluation or {}).get("summary") or {}
    points = {p for cells in summary.values() if isinstance(cells, dict) for p in cells}
    for row in run.trajectory:
        points |= {
            key.split("/")[1] for key in row if key.startswith("eval/") and key.count("/") == 2
        }
    return points


def check_point(runs: list[Run], point: str) -> None:
    """Refuse a point that no run's evaluations report, before anything is written."""
    known = set().union(*(run_points(run) for run in runs)) if runs else set()
    if known and point not in known:
        raise ValueError(
            f"--point {point!r} is not in these runs' evaluations; choose one of {sorted(known)}"
        )


def pick_baseline(groups: list[Group], name: str | None) -> Group:
    """The group named ``name`` (its label, else its algorithm); the first group if None."""
    if name is None:
        return groups[0]
    for group in groups:
        if name in (group.label, group.algorithm):
            return group
    raise ValueError(f"--baseline {name!r} names no group; groups: {[g.label for g in groups]}")
