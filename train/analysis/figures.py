"""The figures of ``train/compare.py``: learning curves, the reward-KL frontier and the
held-out trajectories, each with its numbers written beside it as CSV.

Drawn on matplotlib ``Figure`` objects (no pyplot, so no backend is chosen on import).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import rcParams
from matplotlib.figure import Figure

from cory_rl.train.analysis.comparison import (
    Group,
    frontier_rows,
    reference_points,
    seed_spread,
    series_prefixes,
    write_csv,
)
from cory_rl.train.analysis.run_plots import QUANTITIES
from cory_rl.train.analysis.trajectories import trajectory
from cory_rl.train.config.files import write_beside
from cory_rl.train.evaluation import measures


def plot_curves(
    groups: list[Group], kind: str, out: Path, eta: float | None, band: str = "minmax"
) -> tuple[Path, Path]:
    """One row per agent (or role), one column per quantity; writes the PNG and its CSV."""
    prefixes = series_prefixes(groups, kind)
    fig = Figure(figsize=(13, 3.2 * max(len(prefixes), 1)))
    axes = fig.subplots(max(len(prefixes), 1), 3, squeeze=False)
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
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
                records += [
                    {"group": group.label, "curve": prefix, "quantity": quantity, **t}
                    for t in table
                ]
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
    columns = ["group", "curve", "quantity", "iteration", "mean", "std", "min", "max", "seeds"]
    write_csv(table_csv, records, columns)
    return png, table_csv


def plot_frontier(groups: list[Group], point: str, out: Path) -> tuple[Path, Path] | None:
    rows = frontier_rows(groups, point)
    if not rows:
        return None
    fig = Figure(figsize=(6.5, 4.8))
    ax = fig.subplots()
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    for a, algorithm in enumerate(sorted({r["algorithm"] for r in rows})):
        colour = colours[a % len(colours)]
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.scatter(
            [r["kl"] for r in mine],
            [r["reward"] for r in mine],
            color=colour,
            alpha=0.7,
            label=algorithm,
        )
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
    write_csv(table_csv, rows, list(rows[0]))
    return png, table_csv


def plot_trajectories(groups: list[Group], point: str, out: Path) -> list[Path]:
    """``trajectory.png`` (KL against reward per seed) and ``objective.png`` (``r - eta*KL``
    against updates, mean over seeds per group and eta), with ``trajectory.csv``."""
    records = [
        {
            "group": g.label,
            "run": str(r.path),
            "seed": r.config.get("seed"),
            "updates": u,
            "kl": kl,
            "reward": rw,
        }
        for g in groups
        for r in g.runs
        for u, kl, rw in trajectory(r, point)
    ]
    if not records:
        return []
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    fig = Figure(figsize=(6.5, 4.8))
    ax = fig.subplots()
    fig2 = Figure(figsize=(4 * len(measures.ETAS), 3.4))
    axes = fig2.subplots(1, len(measures.ETAS), squeeze=False)
    for g, group in enumerate(groups):
        colour = colours[g % len(colours)]
        label = group.label
        by_updates: dict[int, list[tuple[float, float]]] = {}
        for run in group.runs:
            points = trajectory(run, point)
            if not points:
                continue
            ax.plot(
                [p[1] for p in points],
                [p[2] for p in points],
                color=colour,
                alpha=0.8,
                marker=".",
                label=label,
            )
            label = None
            for u, kl, rw in points:
                by_updates.setdefault(u, []).append((kl, rw))
        updates = sorted(by_updates)
        for e, eta in enumerate(measures.ETAS):
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
        written.append(out / name)
    write_csv(out / "trajectory.csv", records, list(records[0]))
    return [*written, out / "trajectory.csv"]
