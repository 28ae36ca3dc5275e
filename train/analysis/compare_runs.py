"""A comparison of runs: seeds grouped, learning curves, held-out trajectories, tests per
comparison; the command is ``python train/compare.py`` (``cory-compare``). Runs
whose configs differ only in ``seed`` (and ``run_dir``) form one group. It writes:

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
  Welch test against the baseline; for an answer-checked task ``pass_at_k.md``: pass@k and
  KL along training, and for its two-agent games ``reference_use.md``: the observer's
  pass@1 after a right and after a wrong pioneer answer along training.

Each figure's and table's numbers are written beside it as CSV.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cory_rl.train.analysis.comparison import (
    Group,
    check_point,
    comparison_rows,
    group_runs,
    load_run,
    pick_baseline,
    run_folders,
    summary_rows,
    write_csv,
)
from cory_rl.train.analysis.figures import plot_curves, plot_frontier, plot_trajectories
from cory_rl.train.analysis.trajectories import (
    COLLAPSE,
    default_kls,
    kl_notes,
    matched_kl_rows,
    pass_at_k_rows,
    reference_use_rows,
)
from cory_rl.train.config.files import write_text
from cory_rl.train.evaluation import inference, measures


# ----------------------------------------------------------------------------- summary
def _t_text(row: dict[str, Any], name: str, digits: int = 3) -> tuple[str, str]:
    """ "mean ± std" and the t-interval of ``summary_rows``' ``name``, "n/a" where one seed
    has no spread; empty where the group has no such value."""
    if f"{name}_mean" not in row:
        return "", ""
    mean, std = row[f"{name}_mean"], row[f"{name}_std"]
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    std_text = "n/a" if std is None else f"{std:.{digits}f}"
    ci = "n/a" if low is None else f"[{low:.{digits}f}, {high:.{digits}f}]"
    return f"{mean:.{digits}f} ± {std_text}", ci


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
        f"per answer, and pooled over blocks of {measures.DISTINCT_POOL} answers.",
        "",
        "| group | seeds | answers / seed | test reward | 95% CI | reward - base | 95% CI | "
        "test KL | 95% CI | distinct-2 (answer) | distinct-2 (pooled) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row["group"], str(row["seeds"]), str(row["answers_per_seed"])]
        cells += _t_text(row, "reward")
        cells += _t_text(row, "reward_minus_base")
        cells += _t_text(row, "kl", 2)
        for key in ("distinct_2", "distinct_2_pooled"):
            cells.append(_t_text(row, key)[0] or "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def _column_order(key: str) -> tuple[int, str]:
    first = ("group", "algorithm", "seeds", "answers_per_seed")
    return (first.index(key), key) if key in first else (len(first), key)


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
        welch_ci = (
            "n/a"
            if r["welch_p"] is None
            else f"[{r['welch_ci_low']:.3f}, {r['welch_ci_high']:.3f}]"
        )
        query_ci = (
            "n/a"
            if r["query_ci_low"] is None
            else f"[{r['query_ci_low']:.3f}, {r['query_ci_high']:.3f}]"
        )
        lines.append(
            f"| {r['group']} | {r['seeds']} | {r['baseline']} | {r['baseline_seeds']} | "
            f"{r['diff']:+.3f} | {welch_ci} | {_fmt(r['welch_p'])} | "
            f"{'n/a' if r['query_diff'] is None else format(r['query_diff'], '+.3f')} | "
            f"{query_ci} | {r['queries'] or 'n/a'} |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


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
        "group's comparison, the smallest difference Welch's test at 0.05 finds with 80% "
        "power were the seeds' variances the true ones (unadjusted: Holm asks more), and "
        "Hedges' g with its 95% interval; collapse indicators at the same KL, mean over "
        "seeds, with the Welch p against the baseline in brackets.",
        "",
        "| KL | group | seeds | reward | 95% CI | difference | 95% CI (Welch) | p (Welch) | "
        f"p (Holm) | detectable (80%) | Hedges' g [95% CI] | distinct-2 (pooled "
        f"{measures.DISTINCT_POOL}) | repetitive (tokens) | repetitive (words) | entropy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = "n/a" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        welch = (
            "n/a"
            if r["welch_p"] is None
            else f"[{r['welch_ci_low']:.3f}, {r['welch_ci_high']:.3f}]"
        )
        diff = "" if r["diff"] is None else f"{r['diff']:+.3f}"
        g = "n/a"
        if r["hedges_g"] is not None:
            g = f"{r['hedges_g']:+.2f} [{r['g_ci_low']:+.2f}, {r['g_ci_high']:+.2f}]"
        lines.append(
            f"| {r['kl']:g} | {r['group']} | {r['seeds']}/{r['seeds_total']} | "
            f"{r['reward']:.3f} ± {_fmt(r['std'])} | {ci} | {diff} | {welch} | "
            f"{_fmt(r['welch_p'])} | {_fmt(r['welch_p_holm'])} | {_fmt(r.get('detectable'))} | "
            f"{g} | " + " | ".join(_collapse_cell(r, q) for q in COLLAPSE) + " |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def _by_evaluation(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Per-seed rows along training, gathered per group and number of updates."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["group"], row["updates"]), []).append(row)
    return cells


def _over_seeds(seeds: list[dict[str, Any]], name: str, missing: str = "") -> str:
    """``name``'s mean ± std over the seeds that have it (the mean alone for one seed)."""
    values = [r[name] for r in seeds if r.get(name) is not None]
    if not values:
        return missing
    t = inference.t_interval(values)
    return f"{t['mean']:.3f}" + ("" if t["std"] is None else f" ± {t['std']:.3f}")


def write_pass_at_k(groups: list[Group], point: str, out: Path) -> tuple[Path, Path] | None:
    """``pass_at_k.csv`` (per seed) and ``pass_at_k.md`` (mean ± std over seeds) along
    training, for an answer-checked task; None for another task."""
    rows = pass_at_k_rows(groups, point)
    if not rows:
        return None
    ks = sorted({c for r in rows for c in r if c.startswith("pass@")}, key=lambda c: int(c[5:]))
    table_csv, table_md = out / "pass_at_k.csv", out / "pass_at_k.md"
    write_csv(table_csv, rows, ["group", "seed", "updates", "kl", *ks])
    lines = [
        f"pass@k and held-out KL at {point!r} along training, mean ± std over seeds (the "
        "unbiased pass@k of each query's answers, averaged over queries).",
        "",
        "| group | updates | seeds | KL | " + " | ".join(ks) + " |",
        "|---|---|---|---|" + "---|" * len(ks),
    ]
    for (label, updates), seeds in _by_evaluation(rows).items():
        # empty where a k this group's answers per query do not reach
        lines.append(
            f"| {label} | {updates} | {len(seeds)} | {_over_seeds(seeds, 'kl')} | "
            + " | ".join(_over_seeds(seeds, k) for k in ks)
            + " |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def write_reference_use(groups: list[Group], out: Path) -> tuple[Path, Path] | None:
    """``reference_use.csv`` (per seed) and ``reference_use.md`` (mean ± std over seeds)
    along training, for an answer-checked two-agent game; None for another."""
    rows = reference_use_rows(groups)
    if not rows:
        return None
    table_csv, table_md = out / "reference_use.csv", out / "reference_use.md"
    write_csv(table_csv, rows, ["group", "seed", "updates", "given_right", "given_wrong"])
    lines = [
        "The observer's pass@1 after a right pioneer answer and after a wrong one in the same "
        "game, along training, mean ± std over seeds: a correct reference is used when the "
        "first is well above the second.",
        "",
        "| group | updates | seeds | after a right answer | after a wrong answer |",
        "|---|---|---|---|---|",
    ]
    for (label, updates), seeds in _by_evaluation(rows).items():
        lines.append(
            f"| {label} | {updates} | {len(seeds)} | {_over_seeds(seeds, 'given_right', 'n/a')} "
            f"| {_over_seeds(seeds, 'given_wrong', 'n/a')} |"
        )
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


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
    written = [
        *plot_curves(groups, "agents", out, eta, band),
        *plot_curves(groups, "roles", out, eta, band),
    ]
    frontier = plot_frontier(groups, point, out)
    if frontier is None:
        print(
            f"compare: no run has a held-out evaluation with {point!r}: no frontier "
            "(python train/evaluate.py RUN_DIR ..., or train with --eval_every)"
        )
    else:
        written += frontier
        written += write_summary(groups, point, out) or ()
        written += write_comparisons(groups, base_group, point, out) or ()
    written += plot_trajectories(groups, point, out)
    kls = at_kl if at_kl else default_kls(groups, point)
    for note in kl_notes(groups, point, kls):
        print(note)
    matched = write_matched_kl(groups, base_group, point, kls, out)
    if matched is None and at_kl:
        print(
            f"compare: no seed reaches any of --at_kl {' '.join(f'{k:g}' for k in at_kl)}: "
            "no matched-KL table"
        )
    written += matched or ()
    written += write_pass_at_k(groups, point, out) or ()
    written += write_reference_use(groups, out) or ()
    for group in groups:
        print(f"compare: {group.label}: {len(group.runs)} seed(s)")
    return written
