"""Compare runs: seeds grouped, learning curves, held-out trajectories, tests per comparison.

python train/compare.py RUN_DIR [RUN_DIR ...] [--out DIR]   # or a sweep folder
python train/compare.py runs/sweep --point pioneer --baseline ppo --at_kl 2 5 10

Runs whose configs differ only in ``seed`` (and ``run_dir``) form one group. It writes:

* ``curves-agents.png`` / ``curves-roles.png``: training reward, KL and ``r - eta*KL`` per
  agent and per role from each run's ``metrics.jsonl``: mean over seeds and the min-max
  band (``--band std``: mean +- std).
* ``frontier.png``: each run's final held-out evaluation (``eval.json``, else its last
  ``evals/`` file) as a (test KL, test reward) point, the base model as a star.
* ``summary.md``: per group, over seeds: mean, std and t-interval (n-1 degrees of freedom;
  "n/a" for one seed) of the test reward, of the paired difference to the base model, of
  the test KL and of distinct-2 (per answer, and pooled over a fixed number of answers).
* ``comparisons.md``: each group against ``--baseline`` (default: the first group): the
  difference of test rewards with its Welch t-interval and p-value over seeds, and beside
  it the bootstrap interval over queries of the per-query difference (the groups answered
  the same evaluation set).
* With evaluations along training (``--eval_every``): ``trajectory.png`` (held-out KL
  against reward, one line per seed), ``objective.png`` (``r - eta*KL`` against updates for
  each eta), and ``matched_kl.md``: each group's held-out reward at the same KL, read off
  each seed's trajectory (linear between evaluations), with intervals over seeds and a
  Welch test against the baseline.

Each figure's and table's numbers are written beside it as CSV.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from train import metrics, results
from train.arguments import ArgumentParser, number_at_least
from train.files import write_beside, write_text
from train.run_folder import EVAL_KEY, final_evaluation

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from train.run_folder import load_run_config, read_evaluations, read_metrics

IGNORED = ("seed", "run_dir", "report_to")
"""Settings in which runs of one group may differ (where logs go changes no result)."""
QUANTITIES = (("score", "task reward"), ("kl", "KL(pi || pi_ref)"), ("objective", "r - eta * KL"))


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
    # Resolved as a run's config is everywhere: older names read under today's, numbers
    # in their declared types (a lora_alpha saved as 32.0 is 32), and a setting added
    # after the run was saved at its default, whose behaviour the run had.
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
        parts = [f"{k.split('.')[-1]}={_plain(flats[key].get(k))}" for k in varying]
        groups.append(Group(" ".join([algorithm, *parts]), algorithm, members))
    return groups


def _plain(text: str | None) -> str:
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


def _spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value): the band of a curve."""
    t = metrics.t_interval(values)
    return t["mean"], t["std"] or 0.0


def seed_spread(group: Group, key: str, eta: float | None) -> list[dict[str, Any]]:
    """Per iteration: mean, std, min and max over the group's seeds that logged it."""
    per_run = [series(run, key, eta) for run in group.runs]
    iterations = sorted(set().union(*per_run))
    table = []
    for it in iterations:
        values = [s[it] for s in per_run if it in s]
        mean, std = _spread(values)
        table.append({
            "iteration": it, "mean": mean, "std": std,
            "min": float(min(values)), "max": float(max(values)), "seeds": len(values),
        })  # fmt: skip
    return table


def _prefixes(groups: list[Group], kind: str) -> list[str]:
    keys = {k.split("/")[0] for g in groups for r in g.runs for row in r.rows for k in row
            if k.endswith("/score")}  # fmt: skip
    if kind == "agents":
        return sorted(k for k in keys if k.startswith("llm_"))
    return sorted((k for k in keys if not k.startswith("llm_")), key=lambda r: (r != "pioneer", r))


def plot_curves(
    groups: list[Group], kind: str, out: Path, eta: float | None, band: str = "minmax"
) -> tuple[Path, Path]:
    """One row per agent (or role), one column per quantity; writes the PNG and its CSV."""
    prefixes = _prefixes(groups, kind)
    fig, axes = plt.subplots(
        max(len(prefixes), 1), 3, figsize=(13, 3.2 * max(len(prefixes), 1)), squeeze=False
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    records = []
    for r, prefix in enumerate(prefixes):
        for c, (quantity, title) in enumerate(QUANTITIES):
            ax = axes[r][c]
            for g, group in enumerate(groups):
                table = seed_spread(group, f"{prefix}/{quantity}", eta)
                if not table:
                    continue
                x = [t["iteration"] for t in table]
                mean = np.array([t["mean"] for t in table])
                if band == "std":
                    std = np.array([t["std"] for t in table])
                    low, high = mean - std, mean + std
                else:
                    low, high = [t["min"] for t in table], [t["max"] for t in table]
                colour = colours[g % len(colours)]
                seeds = len(group.runs)
                ax.plot(x, mean, color=colour, linewidth=1.4, label=f"{group.label} ({seeds})")
                ax.fill_between(x, low, high, color=colour, alpha=0.2, linewidth=0)
                records += [{"group": group.label, "curve": prefix, "quantity": quantity, **t}
                            for t in table]  # fmt: skip
            ax.set_title(f"{title}: {prefix}")
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    if prefixes:
        axes[0][0].legend(fontsize=7, title="group (seeds)", title_fontsize=7)
    spread = "min-max over seeds" if band == "minmax" else "mean +- std over seeds"
    fig.suptitle(f"per {kind[:-1]}: mean and {spread}")
    fig.tight_layout()
    png, table_csv = out / f"curves-{kind}.png", out / f"curves-{kind}.csv"
    write_beside(png, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    columns = ["group", "curve", "quantity", "iteration", "mean", "std", "min", "max", "seeds"]
    write_csv(table_csv, records, columns)
    return png, table_csv


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
            rows.append({
                "run": str(run.path), "group": group.label, "algorithm": group.algorithm,
                "seed": run.config.get("seed"), "point": point, "kl": cell["kl"],
                "reward": cell["reward"],
                **{f"r - {eta:g} KL": cell["reward"] - eta * cell["kl"] for eta in metrics.ETAS},
            })  # fmt: skip
    for algorithm in {r["algorithm"] for r in rows}:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        front = set(metrics.pareto_front([(r["kl"], r["reward"]) for r in mine]))
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


def plot_frontier(groups: list[Group], point: str, out: Path) -> tuple[Path, Path] | None:
    rows = frontier_rows(groups, point)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for a, algorithm in enumerate(sorted({r["algorithm"] for r in rows})):
        colour = colours[a % len(colours)]
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.scatter([r["kl"] for r in mine], [r["reward"] for r in mine], color=colour,
                   alpha=0.7, label=algorithm)  # fmt: skip
        front = sorted((r for r in mine if r["on_front"]), key=lambda r: r["kl"])
        ax.plot([r["kl"] for r in front], [r["reward"] for r in front], color=colour)
    refs = reference_points(groups, point)
    if refs:
        ax.scatter(*zip(*refs, strict=True), marker="*", s=160, color="black", label="base model")
    ax.set_xlabel("test KL(pi || pi_ref), summed over the answer")
    ax.set_ylabel("test task reward")
    ax.set_title(f"reward-KL frontier ({point})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png, table_csv = out / "frontier.png", out / "frontier.csv"
    write_beside(png, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    write_csv(table_csv, rows, list(rows[0]))
    return png, table_csv


# ----------------------------------------------------------------------------- summary
def _t_cells(values: list[float], digits: int = 3) -> tuple[str, str]:
    """ "mean ± std" and the t-interval over seeds, "n/a" where one seed has no spread."""
    t = metrics.t_interval(values)
    std = "n/a" if t["std"] is None else f"{t['std']:.{digits}f}"
    ci = "n/a" if t["ci"] is None else f"[{t['ci'][0]:.{digits}f}, {t['ci'][1]:.{digits}f}]"
    return f"{t['mean']:.{digits}f} ± {std}", ci


def summary_rows(groups: list[Group], point: str) -> list[dict[str, Any]]:
    """Per group, over its evaluated seeds: test reward, base reward, the paired difference
    (each seed's mean over queries of reward - base), test KL and distinct-2."""
    rows = []
    for group in groups:
        cells = [c for run in group.runs if (c := _cell(run, "trained", point)) is not None]
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
            "reward_minus_base": [c["reward_minus_base"]["mean"] for c in cells
                                  if c.get("reward_minus_base")],
            "kl": [c.get("kl", math.nan) for c in cells],
            "distinct_2": [c["distinct_2"] for c in cells if c.get("distinct_2") is not None],
            "distinct_2_pooled": [c["distinct_2_pooled"] for c in cells
                                  if c.get("distinct_2_pooled") is not None],
        }  # fmt: skip
        for name, vals in values.items():
            if not vals:
                continue
            t = metrics.t_interval(vals)
            row[f"{name}_mean"], row[f"{name}_std"] = t["mean"], t["std"]
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = t["ci"] or (None, None)
        rows.append(row)
    return rows


def _cell(run: Run, model: str, point: str) -> dict[str, Any] | None:
    return (((run.evaluation or {}).get("summary") or {}).get(model) or {}).get(point)


def write_summary(groups: list[Group], point: str, out: Path) -> tuple[Path, Path] | None:
    """``summary.csv`` and ``summary.md``: the table a results section quotes."""
    rows = summary_rows(groups, point)
    if not rows:
        return None
    table_csv, table_md = out / "summary.csv", out / "summary.md"
    write_csv(table_csv, rows, sorted({k for r in rows for k in r}, key=_column_order))
    lines = [
        f"Held-out results at {point!r}: mean ± std over seeds and the 95% t-interval "
        "(n-1 degrees of freedom; n/a for one seed). reward - base: each seed's paired "
        "difference to the base model on the same answers (mean over queries). Distinct-2 "
        f"per answer, and pooled over blocks of {metrics.DISTINCT_POOL} answers.",
        "",
        "| group | seeds | answers / seed | test reward | 95% CI | reward - base | 95% CI | "
        "test KL | 95% CI | distinct-2 (answer) | distinct-2 (pooled) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group in groups:
        cells = [c for run in group.runs if (c := _cell(run, "trained", point)) is not None]
        if not cells:
            continue
        row = [group.label, str(len(cells)), str(min(c["n"] for c in cells))]
        row += _t_cells([c["reward"] for c in cells])
        diffs = [c["reward_minus_base"]["mean"] for c in cells if c.get("reward_minus_base")]
        row += _t_cells(diffs) if diffs else ("", "")
        row += _t_cells([c.get("kl", math.nan) for c in cells], 2)
        for key in ("distinct_2", "distinct_2_pooled"):
            vals = [c[key] for c in cells if c.get(key) is not None]
            row.append(_t_cells(vals)[0] if vals else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def _column_order(key: str) -> tuple[int, str]:
    first = ("group", "algorithm", "seeds", "answers_per_seed")
    return (first.index(key), key) if key in first else (len(first), key)


# ----------------------------------------------------------------------------- comparisons
def per_query_rewards(run: Run, point: str) -> dict[int, float] | None:
    """The trained agents' mean held-out reward per query at ``point`` (a role or all)."""
    answers = (run.evaluation or {}).get("answers")
    if not answers:
        return None
    rows = [i for i, (m, r) in enumerate(zip(answers["model"], answers["role"], strict=True))
            if m == "trained" and point in ("all", r)]  # fmt: skip
    if not rows:
        return None
    units, means = metrics.per_unit_means(
        [answers["query"][i] for i in rows], [answers["reward"][i] for i in rows]
    )
    return dict(zip(units.tolist(), means.tolist(), strict=True))


def query_bootstrap(group: Group, baseline: Group, point: str) -> dict[str, Any] | None:
    """The difference of two groups per query (each query's reward averaged over the
    group's seeds), with its bootstrap interval over queries; None unless every run of
    both answered one and the same evaluation set."""
    sets = {json.dumps((r.evaluation or {}).get("eval_set"), sort_keys=True)
            for r in (*group.runs, *baseline.runs)}  # fmt: skip
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
    return {"mean": float(np.mean(diffs)), "ci": metrics.bootstrap_ci(diffs),
            "queries": len(units)}  # fmt: skip


def comparison_rows(groups: list[Group], baseline: Group, point: str) -> list[dict[str, Any]]:
    """Each group's test reward against the baseline's: Welch over seeds, bootstrap over
    queries."""
    rows = []
    base = [c["reward"] for run in baseline.runs if (c := _cell(run, "trained", point))]
    for group in groups:
        if group is baseline:
            continue
        mine = [c["reward"] for run in group.runs if (c := _cell(run, "trained", point))]
        if not mine or not base:
            continue
        welch = metrics.welch_test(mine, base)
        boot = query_bootstrap(group, baseline, point)
        rows.append({
            "group": group.label, "baseline": baseline.label, "point": point,
            "seeds": len(mine), "baseline_seeds": len(base),
            "diff": float(np.mean(mine) - np.mean(base)),
            "welch_ci_low": welch["ci"][0] if welch else None,
            "welch_ci_high": welch["ci"][1] if welch else None,
            "welch_p": welch["p"] if welch else None,
            "welch_df": welch["df"] if welch else None,
            "query_diff": boot["mean"] if boot else None,
            "query_ci_low": (boot["ci"] or [None])[0] if boot else None,
            "query_ci_high": (boot["ci"] or [None, None])[1] if boot else None,
            "queries": boot["queries"] if boot else None,
        })  # fmt: skip
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_comparisons(
    groups: list[Group], baseline: Group, point: str, out: Path
) -> tuple[Path, Path] | None:
    rows = comparison_rows(groups, baseline, point)
    if not rows:
        return None
    table_csv, table_md = out / "comparisons.csv", out / "comparisons.md"
    write_csv(table_csv, rows, list(rows[0]))
    lines = [
        f"Held-out reward at {point!r}, each group minus {baseline.label!r}: over seeds, the "
        "difference of means with its Welch t-interval and two-sided p-value (n/a with one "
        "seed on a side); over queries, the mean per-query difference (each query's reward "
        "averaged over a group's seeds) with its 95% bootstrap interval.",
        "",
        "| group | seeds | vs | seeds | difference | 95% CI (Welch) | p (Welch) | "
        "per-query difference | 95% CI (queries) | queries |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        welch_ci = ("n/a" if r["welch_p"] is None
                    else f"[{r['welch_ci_low']:.3f}, {r['welch_ci_high']:.3f}]")  # fmt: skip
        query_ci = ("n/a" if r["query_ci_low"] is None
                    else f"[{r['query_ci_low']:.3f}, {r['query_ci_high']:.3f}]")  # fmt: skip
        lines.append(
            f"| {r['group']} | {r['seeds']} | {r['baseline']} | {r['baseline_seeds']} | "
            f"{r['diff']:+.3f} | {welch_ci} | {_fmt(r['welch_p'])} | "
            f"{'n/a' if r['query_diff'] is None else format(r['query_diff'], '+.3f')} | "
            f"{query_ci} | {r['queries'] or 'n/a'} |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


# ----------------------------------------------------------------------------- trajectories
COLLAPSE = ("distinct_2_pooled", "repetitive", "entropy")
"""Collapse indicators compared at matched KL besides the reward."""


def trajectory(run: Run, point: str, quantity: str = "reward") -> list[tuple[int, float, float]]:
    """(updates, held-out KL, held-out ``quantity``) of each evaluation along the run."""
    out = []
    for row in run.trajectory:
        value, kl = row.get(f"eval/{point}/{quantity}"), row.get(f"eval/{point}/kl")
        if value is not None and kl is not None:
            out.append((int(row[EVAL_KEY]), float(kl), float(value)))
    return out


def default_kls(groups: list[Group], point: str, count: int = 4) -> list[float]:
    """``count`` KL values up to the largest KL that every seed's trajectory reaches."""
    reached = [max(kl for _, kl, _ in t) for g in groups for r in g.runs
               if (t := trajectory(r, point))]  # fmt: skip
    if not reached:
        return []
    top = min(reached)
    return [round(top * (i + 1) / count, 6) for i in range(count)] if top > 0 else []


def matched_kl_rows(
    groups: list[Group], baseline: Group, point: str, kls: list[float]
) -> list[dict[str, Any]]:
    """Per group and KL: the held-out reward at that KL on each seed's trajectory, over
    seeds (t-interval), and the Welch test against the baseline at the same KL; beside it
    the collapse indicators at that KL, mean over seeds, each with its Welch p against the
    baseline (``<indicator>_p``), so "more diverse at the same KL" is a tested claim."""

    def at(group: Group, kl: float, quantity: str = "reward") -> list[float]:
        values = []
        for run in group.runs:
            points = trajectory(run, point, quantity)
            if points:
                y = metrics.value_at([p[1] for p in points], [p[2] for p in points], kl)
                if y is not None:
                    values.append(y)
        return values

    def collapse(group: Group, kl: float, base: dict[str, list[float]]) -> dict[str, Any]:
        means: dict[str, float | None] = {}
        tests: dict[str, float | None] = {}
        for q in COLLAPSE:
            values = at(group, kl, q)
            test = metrics.welch_test(values, base[q]) if group is not baseline else None
            means[q] = float(np.mean(values)) if values else None
            tests[f"{q}_p"] = test["p"] if test else None
        return {**means, **tests}

    rows = []
    for kl in kls:
        base = at(baseline, kl)
        base_collapse = {q: at(baseline, kl, q) for q in COLLAPSE}
        for group in groups:
            values = at(group, kl)
            if not values:
                continue
            t = metrics.t_interval(values)
            welch = metrics.welch_test(values, base) if group is not baseline else None
            effect = metrics.hedges_g(values, base) if group is not baseline else None
            rows.append({
                "group": group.label, "kl": kl, "seeds": len(values),
                "seeds_total": len(group.runs), "reward": t["mean"], "std": t["std"],
                "ci_low": (t["ci"] or [None])[0], "ci_high": (t["ci"] or [None, None])[1],
                "baseline": baseline.label,
                "diff": t["mean"] - float(np.mean(base)) if base and group is not baseline
                else None,
                "welch_ci_low": welch["ci"][0] if welch else None,
                "welch_ci_high": welch["ci"][1] if welch else None,
                "welch_p": welch["p"] if welch else None,
                "hedges_g": effect["g"] if effect else None,
                "g_ci_low": effect["ci"][0] if effect else None,
                "g_ci_high": effect["ci"][1] if effect else None,
                **collapse(group, kl, base_collapse),
            })  # fmt: skip
    for group in groups:  # one comparison = a group against the baseline at every KL
        mine = [r for r in rows if r["group"] == group.label]
        for row, adjusted in zip(mine, metrics.holm([r["welch_p"] for r in mine]), strict=True):
            row["welch_p_holm"] = adjusted
    return rows


def _collapse_cell(row: dict[str, Any], quantity: str) -> str:
    """The indicator's mean over seeds, its Welch p against the baseline in brackets."""
    cell = _fmt(row[quantity], 2 if quantity == "entropy" else 3)
    p = row[f"{quantity}_p"]
    return cell if p is None else f"{cell} ({_fmt(p)})"


def write_matched_kl(
    groups: list[Group], baseline: Group, point: str, kls: list[float], out: Path
) -> tuple[Path, Path] | None:
    rows = matched_kl_rows(groups, baseline, point, kls)
    if not rows:
        return None
    table_csv, table_md = out / "matched_kl.csv", out / "matched_kl.md"
    write_csv(table_csv, rows, list(rows[0]))
    lines = [
        f"Held-out reward at matched held-out KL ({point!r}), read off each seed's trajectory "
        "(linear between evaluations; a seed that never reaches the KL is left out): mean ± "
        f"std over seeds, 95% t-interval, and the difference to {baseline.label!r} with its "
        "Welch interval and p-value, the p-value Holm-adjusted over the KLs of the "
        "group's comparison, and Hedges' g with its 95% interval; collapse indicators at the "
        "same KL, mean over seeds, with the Welch p against the baseline in brackets.",
        "",
        "| KL | group | seeds | reward | 95% CI | difference | 95% CI (Welch) | p (Welch) | "
        f"p (Holm) | Hedges' g [95% CI] | distinct-2 (pooled {metrics.DISTINCT_POOL}) | "
        "repetitive | entropy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = "n/a" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        welch = ("n/a" if r["welch_p"] is None
                 else f"[{r['welch_ci_low']:.3f}, {r['welch_ci_high']:.3f}]")  # fmt: skip
        diff = "" if r["diff"] is None else f"{r['diff']:+.3f}"
        g = "n/a"
        if r["hedges_g"] is not None:
            g = f"{r['hedges_g']:+.2f} [{r['g_ci_low']:+.2f}, {r['g_ci_high']:+.2f}]"
        lines.append(
            f"| {r['kl']:g} | {r['group']} | {r['seeds']}/{r['seeds_total']} | "
            f"{r['reward']:.3f} ± {_fmt(r['std'])} | {ci} | {diff} | {welch} | "
            f"{_fmt(r['welch_p'])} | {_fmt(r['welch_p_holm'])} | {g} | "
            + " | ".join(_collapse_cell(r, q) for q in COLLAPSE)
            + " |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def plot_trajectories(groups: list[Group], point: str, out: Path) -> list[Path]:
    """``trajectory.png`` (KL against reward per seed) and ``objective.png`` (``r - eta*KL``
    against updates, mean over seeds per group and eta), with ``trajectory.csv``."""
    records = [{"group": g.label, "run": str(r.path), "seed": r.config.get("seed"),
                "updates": u, "kl": kl, "reward": rw}
               for g in groups for r in g.runs for u, kl, rw in trajectory(r, point)]  # fmt: skip
    if not records:
        return []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    fig2, axes = plt.subplots(1, len(metrics.ETAS), figsize=(4 * len(metrics.ETAS), 3.4),
                              squeeze=False)  # fmt: skip
    for g, group in enumerate(groups):
        colour = colours[g % len(colours)]
        label = group.label
        by_updates: dict[int, list[tuple[float, float]]] = {}
        for run in group.runs:
            points = trajectory(run, point)
            if not points:
                continue
            ax.plot([p[1] for p in points], [p[2] for p in points], color=colour, alpha=0.8,
                    marker=".", label=label)  # fmt: skip
            label = None
            for u, kl, rw in points:
                by_updates.setdefault(u, []).append((kl, rw))
        updates = sorted(by_updates)
        for e, eta in enumerate(metrics.ETAS):
            ys = [np.mean([rw - eta * kl for kl, rw in by_updates[u]]) for u in updates]
            axes[0][e].plot(updates, ys, color=colour, marker=".", label=group.label)
            axes[0][e].set_title(f"r - {eta:g} KL ({point})")
            axes[0][e].set_xlabel("updates")
            axes[0][e].grid(alpha=0.3)
    ax.set_xlabel("held-out KL(pi || pi_ref), summed over the answer")
    ax.set_ylabel("held-out task reward")
    ax.set_title(f"held-out trajectories ({point}), one line per seed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    axes[0][0].legend(fontsize=7)
    written = []
    for figure, name in ((fig, "trajectory.png"), (fig2, "objective.png")):
        figure.tight_layout()
        write_beside(out / name, lambda tmp, figure=figure: figure.savefig(tmp, dpi=110))
        plt.close(figure)
        written.append(out / name)
    write_csv(out / "trajectory.csv", records, list(records[0]))
    return [*written, out / "trajectory.csv"]


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    write_beside(path, write)


def compare(
    paths: list[Path],
    out: Path | None = None,
    point: str = "pioneer",
    eta: float | None = None,
    band: str = "minmax",
    baseline: str | None = None,
    at_kl: list[float] | None = None,
) -> list[Path]:
    """Draw every figure and write every table into ``out`` (default: ``compare/`` beside
    the runs). ``baseline``: the label (or algorithm) of the group the others are tested
    against, default the first group; ``at_kl``: the KLs of the matched comparison."""
    runs = [load_run(p) for p in run_folders(paths)]
    check_point(runs, point)
    groups = group_runs(runs)
    if out is None:
        out = Path(os.path.commonpath([p.parent.resolve() for p in (r.path for r in runs)]))
        out = out / "compare"
    out.mkdir(parents=True, exist_ok=True)
    base_group = pick_baseline(groups, baseline)
    written = [*plot_curves(groups, "agents", out, eta, band),
               *plot_curves(groups, "roles", out, eta, band)]  # fmt: skip
    frontier = plot_frontier(groups, point, out)
    if frontier is None:
        print(f"compare: no run has a held-out evaluation with {point!r}: no frontier "
              "(python train/evaluate.py RUN_DIR ..., or train with --eval_every)")  # fmt: skip
    else:
        written += frontier
        written += write_summary(groups, point, out) or ()
        written += write_comparisons(groups, base_group, point, out) or ()
    written += plot_trajectories(groups, point, out)
    kls = at_kl if at_kl else default_kls(groups, point)
    written += write_matched_kl(groups, base_group, point, kls, out) or ()
    for group in groups:
        print(f"compare: {group.label}: {len(group.runs)} seed(s)")
    return written


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
        raise ValueError(f"--point {point!r} is not in these runs' evaluations; "
                         f"choose one of {sorted(known)}")  # fmt: skip


def pick_baseline(groups: list[Group], name: str | None) -> Group:
    """The group named ``name`` (its label, else its algorithm); the first group if None."""
    if name is None:
        return groups[0]
    for group in groups:
        if name in (group.label, group.algorithm):
            return group
    raise ValueError(f"--baseline {name!r} names no group; groups: {[g.label for g in groups]}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--out", type=Path, help="folder for the PNG and CSV files")
    parser.add_argument(
        "--point", default="pioneer", help="a run's frontier point: a role (pioneer...) or all"
    )
    parser.add_argument(
        "--eta", type=number_at_least(0), help="recompute r - eta*KL (default: as logged)"
    )
    parser.add_argument("--band", choices=("minmax", "std"), default="minmax")
    parser.add_argument("--baseline", help="the group the others are tested against "
                        "(a label or an algorithm; default the first group)")  # fmt: skip
    parser.add_argument("--at_kl", type=number_at_least(0), nargs="+",
                        help="held-out KLs of the matched comparison (default: 4 up to the "
                        "largest KL every seed reaches)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        written = compare(args.runs, args.out, args.point, args.eta, args.band, args.baseline,
                          args.at_kl)  # fmt: skip
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
