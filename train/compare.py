"""Compare runs: seeds grouped, learning curves with their spread, and the reward-KL frontier.

python train/compare.py RUN_DIR [RUN_DIR ...] [--out DIR]   # or a sweep folder
python train/compare.py runs/sweep-kl --point pioneer --eta 0.01

Runs whose configs differ only in ``seed`` (and ``run_dir``) form one group. For each
group it draws the mean over seeds and the min-max band (``--band std``: mean +- std) of
task reward, KL and ``r - eta*KL``, per agent (``curves-agents.png``) and per role
(``curves-roles.png``), from each run's ``metrics.jsonl``. From each run's ``eval.json``
(``train/evaluate.py``) it draws the frontier: test KL against test reward, one point per
run, one colour per algorithm, each algorithm's non-dominated points joined, and the base
model as a star (``frontier.png``). Each figure's numbers are written beside it as CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from train import metrics

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IGNORED = ("seed", "run_dir")
"""Settings in which runs of one group may differ."""
QUANTITIES = (("score", "task reward"), ("kl", "KL(pi || pi_ref)"), ("objective", "r - eta * KL"))


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None


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
    from train.config import load_config_file
    from train.plots import read_metrics

    config = load_config_file(path / "config.yaml")
    rows = read_metrics(path) if (path / "metrics.jsonl").exists() else []
    evaluation = path / "eval.json"
    return Run(
        path, config, rows, json.loads(evaluation.read_text()) if evaluation.exists() else None
    )


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (``ppo.init_kl_coef``), values as JSON text."""
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
    """Mean and sample std (0 for one value)."""
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


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
    fig.savefig(png, dpi=110)
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
    fig.savefig(png, dpi=110)
    plt.close(fig)
    write_csv(table_csv, rows, list(rows[0]))
    return png, table_csv


# ----------------------------------------------------------------------------- summary
def summary_rows(groups: list[Group], point: str) -> list[dict[str, Any]]:
    """Per group, over its evaluated seeds: the test reward of the trained model and of
    the base model evaluated beside it, their difference within each evaluation (the
    paired comparison: same queries, so less noise than two means), and the test KL."""
    rows = []
    for group in groups:
        trained, base, gain, kl, games = [], [], [], [], []
        for run in group.runs:
            summary = (run.evaluation or {}).get("summary") or {}
            mine = summary.get("trained", {}).get(point)
            ref = summary.get("reference", {}).get(point)
            if mine is None or ref is None:
                continue
            trained.append(mine["reward"])
            base.append(ref["reward"])
            gain.append(mine["reward"] - ref["reward"])
            kl.append(mine.get("kl", float("nan")))
            games.append(mine.get("n", 0))
        if not trained:
            continue
        row: dict[str, Any] = {"group": group.label, "algorithm": group.algorithm,
                               "seeds": len(trained), "games_per_seed": min(games)}  # fmt: skip
        for name, values in (("reward", trained), ("base_reward", base),
                             ("reward_minus_base", gain), ("kl", kl)):  # fmt: skip
            row[f"{name}_mean"], row[f"{name}_std"] = _spread(values)
        rows.append(row)
    return rows


def write_summary(groups: list[Group], point: str, out: Path) -> tuple[Path, Path] | None:
    """``summary.csv`` and ``summary.md``: the table a results section quotes."""
    rows = summary_rows(groups, point)
    if not rows:
        return None
    table_csv, table_md = out / "summary.csv", out / "summary.md"
    write_csv(table_csv, rows, list(rows[0]))
    lines = [
        f"Test results at {point!r}, mean ± std over seeds (base: the untrained model in "
        "the same evaluation):",
        "",
        "| group | seeds | games / seed | test reward | base model | reward - base | test KL |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[f'{k}_mean']:.3f} ± {r[f'{k}_std']:.3f}"
                 for k in ("reward", "base_reward", "reward_minus_base")]  # fmt: skip
        cells.append(f"{r['kl_mean']:.2f} ± {r['kl_std']:.2f}")
        lines.append(f"| {r['group']} | {r['seeds']} | {r['games_per_seed']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    table_md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return table_csv, table_md


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def compare(
    paths: list[Path],
    out: Path | None = None,
    point: str = "pioneer",
    eta: float | None = None,
    band: str = "minmax",
) -> list[Path]:
    """Draw every figure into ``out`` (default: ``compare/`` beside the runs)."""
    runs = [load_run(p) for p in run_folders(paths)]
    groups = group_runs(runs)
    if out is None:
        out = Path(os.path.commonpath([p.parent.resolve() for p in (r.path for r in runs)]))
        out = out / "compare"
    out.mkdir(parents=True, exist_ok=True)
    written = [*plot_curves(groups, "agents", out, eta, band),
               *plot_curves(groups, "roles", out, eta, band)]  # fmt: skip
    frontier = plot_frontier(groups, point, out)
    if frontier is None:
        print(f"compare: no run has an eval.json with {point!r}: no frontier "
              "(python train/evaluate.py RUN_DIR ...)")  # fmt: skip
    else:
        written += frontier
        written += write_summary(groups, point, out) or ()
    for group in groups:
        print(f"compare: {group.label}: {len(group.runs)} seed(s)")
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--out", type=Path, help="folder for the PNG and CSV files")
    parser.add_argument(
        "--point", default="pioneer", help="a run's frontier point: a role (pioneer...) or all"
    )
    parser.add_argument("--eta", type=float, help="recompute r - eta*KL (default: as logged)")
    parser.add_argument("--band", choices=("minmax", "std"), default="minmax")
    args = parser.parse_args(argv)
    try:
        written = compare(args.runs, args.out, args.point, args.eta, args.band)
    except FileNotFoundError as err:
        parser.error(str(err))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
