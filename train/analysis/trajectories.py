"""Along training: each seed's held-out (KL, value) trajectory, the reward and the collapse
signals read off it at matched KLs with their tests, and pass@k along training."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from cory_rl.train.analysis.comparison import Group, Run
from cory_rl.train.core.run_folder import (
    EVAL_KEY,
    evaluations_along,
)
from cory_rl.train.evaluation import inference

COLLAPSE = ("distinct_2_pooled", "repetitive", "repetitive_words", "entropy")
"""Collapse indicators compared at matched KL besides the reward."""


def trajectory(run: Run, point: str, quantity: str = "reward") -> list[tuple[int, float, float]]:
    """(updates, held-out KL, held-out ``quantity``) of each evaluation along the run."""
    out = []
    for row in run.trajectory:
        value, kl = row.get(f"eval/{point}/{quantity}"), row.get(f"eval/{point}/kl")
        if value is not None and kl is not None:
            out.append((int(row[EVAL_KEY]), float(kl), float(value)))
    return out


def summaries_along(groups: list[Group]) -> Iterator[tuple[Group, Run, int, dict[str, Any]]]:
    """Every evaluation along training of every run: its group, run, updates and each
    model's summary (per role and ``all``)."""
    for group in groups:
        for run in group.runs:
            for evaluation in evaluations_along(run.path):
                for numbers in evaluation.get("summary", {}).values():
                    yield group, run, evaluation["updates"], numbers


def pass_at_k_rows(groups: list[Group], point: str) -> list[dict[str, Any]]:
    """Per run and evaluation along training of an answer-checked task: the updates, the
    held-out KL and pass@k at ``point`` for every k the evaluation reports."""
    rows = []
    for group, run, updates, numbers in summaries_along(groups):
        cell = numbers.get(point) or {}
        if cell.get("pass@k"):
            rows.append(
                {
                    "group": group.label,
                    "seed": run.config.get("seed"),
                    "updates": updates,
                    "kl": cell.get("kl"),
                    **{f"pass@{k}": v for k, v in cell["pass@k"].items()},
                }
            )
    return rows


def reference_use_rows(groups: list[Group]) -> list[dict[str, Any]]:
    """Per run and evaluation along training of an answer-checked two-agent game: the
    observer's pass@1 after a right pioneer answer and after a wrong one (whether it uses a
    correct reference, ``cory_rl.train.evaluation.report.reference_use``)."""
    rows = []
    for group, run, updates, numbers in summaries_along(groups):
        cell = numbers.get("observer") or {}
        right, wrong = cell.get("observer_given_right"), cell.get("observer_given_wrong")
        if right is not None or wrong is not None:
            rows.append(
                {
                    "group": group.label,
                    "seed": run.config.get("seed"),
                    "updates": updates,
                    "given_right": right,
                    "given_wrong": wrong,
                }
            )
    return rows


def default_kls(groups: list[Group], point: str, count: int = 4) -> list[float]:
    """``count`` KL values up to the largest KL that every seed's trajectory reaches."""
    reached = [
        max(kl for _, kl, _ in t) for g in groups for r in g.runs if (t := trajectory(r, point))
    ]
    if not reached:
        return []
    top = min(reached)
    return [round(top * (i + 1) / count, 6) for i in range(count)] if top > 0 else []


def kl_span(groups: list[Group], point: str) -> tuple[float, float] | None:
    """The held-out KLs every seed's trajectory reaches (from the largest of their lowest
    to the smallest of their highest); None when no run has a trajectory."""
    spans = [
        (min(kls), max(kls))
        for g in groups
        for r in g.runs
        if (kls := [kl for _, kl, _ in trajectory(r, point)])
    ]
    if not spans:
        return None
    return max(low for low, _ in spans), min(high for _, high in spans)


def kl_notes(groups: list[Group], point: str, kls: list[float]) -> list[str]:
    """One line for each asked KL that not every seed reaches: its row counts fewer seeds
    than the group has, or there is none (why: a reader would take a row for all seeds)."""
    span = kl_span(groups, point)
    if span is None:
        return []
    low, high = span
    notes = []
    for kl in kls:
        if low <= kl <= high:
            continue
        what = (
            "its rows count only the seeds that reach it"
            if any(_reached(groups, point, kl))
            else "no seed reaches it: it has no row"
        )
        notes.append(
            f"compare: --at_kl {kl:g} is outside the held-out KLs every seed reaches "
            f"({low:g} to {high:g}, point {point!r}); {what}"
        )
    return notes


def _reached(groups: list[Group], point: str, kl: float) -> Iterator[bool]:
    """For each seed of every group: whether its trajectory reaches ``kl``."""
    for group in groups:
        for run in group.runs:
            points = trajectory(run, point)
            xs, ys = [p[1] for p in points], [p[2] for p in points]
            yield bool(points) and inference.value_at(xs, ys, kl) is not None


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
                y = inference.value_at([p[1] for p in points], [p[2] for p in points], kl)
                if y is not None:
                    values.append(y)
        return values

    def collapse(group: Group, kl: float, base: dict[str, list[float]]) -> dict[str, Any]:
        means: dict[str, float | None] = {}
        tests: dict[str, float | None] = {}
        for q in COLLAPSE:
            values = at(group, kl, q)
            compared = group is not baseline and values and base[q]  # an indicator that
            test = inference.welch_test(values, base[q]) if compared else None  # runs lack: none
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
            t = inference.t_interval(values)
            welch = inference.welch_test(values, base) if group is not baseline else None
            effect = inference.hedges_g(values, base) if group is not baseline else None
            rows.append(
                {
                    "group": group.label,
                    "kl": kl,
                    "seeds": len(values),
                    "seeds_total": len(group.runs),
                    "reward": t["mean"],
                    "std": t["std"],
                    "ci_low": (t["ci"] or [None])[0],
                    "ci_high": (t["ci"] or [None, None])[1],
                    "baseline": baseline.label,
                    "diff": t["mean"] - float(np.mean(base))
                    if base and group is not baseline
                    else None,
                    "welch_ci_low": welch["ci"][0] if welch else None,
                    "welch_ci_high": welch["ci"][1] if welch else None,
                    "welch_p": welch["p"] if welch else None,
                    "detectable": welch["detectable"] if welch else None,
                    "hedges_g": effect["g"] if effect else None,
                    "g_ci_low": effect["ci"][0] if effect else None,
                    "g_ci_high": effect["ci"][1] if effect else None,
                    **collapse(group, kl, base_collapse),
                }
            )
    for group in groups:  # one comparison = a group against the baseline at every KL
        mine = [r for r in rows if r["group"] == group.label]
        for row, adjusted in zip(mine, inference.holm([r["welch_p"] for r in mine]), strict=True):
            row["welch_p_holm"] = adjusted
    return rows
