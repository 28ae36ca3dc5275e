"""The tables and the figure of a frontier over a setting (``cory-frontier``); what they
hold: ``cory_rl.train.analysis.frontier``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib import rcParams
from matplotlib.figure import Figure

from cory_rl.train.analysis.comparison import run_folders, write_csv
from cory_rl.train.analysis.frontier import (
    SIGNALS,
    Arm,
    best_within,
    collapse_rows,
    frontier_kls,
    kl_notes,
    knob_rows,
    matched_rows,
    pick_baseline,
    read_arm,
    run_rows,
    seed_trajectories,
)
from cory_rl.train.config.files import write_beside, write_text
from cory_rl.train.core.run_folder import load_run_config

MARKERS = "osD^vP*X"
DIGITS = {"kl": 2, "entropy": 2, "length": 1}
"""Decimals of a signal in the tables (3 where not named)."""


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ci(row: dict[str, Any], name: str, digits: int = 3) -> str:
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    return "n/a" if low is None else f"[{low:.{digits}f}, {high:.{digits}f}]"


def _write(out: Path, stem: str, rows: list[dict[str, Any]], lines: list[str]) -> list[Path]:
    table_csv, table_md = out / f"{stem}.csv", out / f"{stem}.md"
    write_csv(table_csv, rows, list(rows[0]) if rows else [])
    write_text(table_md, "\n".join(lines) + "\n")
    print("\n".join(lines) + "\n")
    return [table_md, table_csv]


def write_runs(arms: list[Arm], setting: str, out: Path) -> list[Path]:
    rows = run_rows(arms)
    lines = [
        f"Each arm at each {setting}: the last held-out evaluation of its counted runs (updates "
        "inside the band), mean over seeds with the 95% t-interval (n/a for one seed), and the "
        "collapse signals there (mean over seeds); every run's updates, stop and health.",
        "",
        f"| arm | {setting} | counted / seeds | KL | 95% CI | reward | 95% CI | entropy | "
        "distinct-2 (pooled) | repetitive (tokens) | repetitive (words) | EOS rate | length | "
        "updates | stopped | health |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['value']:g} | {r['counted']}/{r['seeds']} | "
            f"{_num(r['kl'], 2)} | {_ci(r, 'kl', 2)} | {_num(r['reward'])} | {_ci(r, 'reward')} | "
            f"{_num(r['entropy'], 2)} | {_num(r['distinct_2_pooled'])} | "
            f"{_num(r['repetitive'])} | {_num(r['repetitive_words'])} | {_num(r['eos_rate'])} | "
            f"{_num(r['length'], 1)} | {r['updates']} | {r['stopped']} | {r['health']} |"
        )
    return _write(out, "frontier_runs", rows, lines)


def write_knob(arms: list[Arm], setting: str, out: Path) -> list[Path]:
    rows = knob_rows(arms)
    lines = [
        f"Per arm and seed, the held-out KL at each {setting} (ascending), read at the last "
        "evaluation every one of the seed's runs reached, and whether it falls strictly as "
        f"{setting} grows (every run, counted or not).",
        "",
    ]
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm and r["falls"] is not None]
        falls = sum(bool(r["falls"]) for r in mine)
        lines.append(f"- {algorithm}: falls in {falls} of {len(mine)} seeds")
    lines += [
        "",
        f"| arm | seed | updates | KL at each {setting} | falls strictly | all runs healthy |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        kls = ", ".join(f"{v:g}: {_num(k, 3)}" for v, k in zip(r["values"], r["kls"], strict=True))
        falls = "n/a" if r["falls"] is None else ("yes" if r["falls"] else "**no**")
        lines.append(
            f"| {r['algorithm']} | {r['seed']} | {r['updates']} | {kls} | {falls} | "
            f"{'yes' if r['healthy'] else 'no'} |"
        )
    values = sorted({v for r in rows for v in r["values"]})
    flat = []
    for r in rows:
        at = dict(zip(r["values"], r["kls"], strict=True))
        row = {k: v for k, v in r.items() if k not in ("values", "kls")}
        flat.append(row | {f"kl_at_{v:g}": at.get(v) for v in values})
    return _write(out, "frontier_knob", flat, lines)


def write_matched(arms: list[Arm], kls: list[float], baseline: str, out: Path) -> list[Path]:
    rows = matched_rows(arms, kls, baseline)
    lines = [
        "Each arm's frontier at matched held-out KL: per seed, the best held-out reward any of "
        "its counted runs reached at a KL of at most the given one (read linearly between "
        "evaluations); mean ± std over seeds, the 95% t-interval, and the difference to "
        f"{baseline!r} with Welch's interval and p-value, Holm-adjusted over the KLs; "
        "detectable: the smallest difference Welch's test at 0.05 finds with 80% power, were "
        "the seeds' variances the true ones (unadjusted: Holm asks more).",
        "",
        "| KL | arm | seeds | reward | 95% CI | difference | 95% CI (Welch) | p (Welch) | "
        "p (Holm) | detectable (80%) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = "" if r["diff"] is None else f"{r['diff']:+.3f}"
        lines.append(
            f"| {r['kl']:g} | {r['algorithm']} | {r['seeds']} | {r['reward']:.3f} ± "
            f"{_num(r['std'])} | {_ci(r, 'reward')} | {diff} | {_ci(r, 'welch')} | "
            f"{_num(r['welch_p'])} | {_num(r['welch_p_holm'])} | {_num(r.get('detectable'))} |"
        )
    if not rows:
        lines.append("| (no KL that every counted seed of both arms reaches) ||||||||||")
    return _write(out, "frontier_matched", rows, lines)


def write_collapse(arms: list[Arm], setting: str, out: Path) -> list[Path]:
    rows = collapse_rows(arms)
    names = {
        "kl": "KL",
        "reward": "reward",
        "entropy": "entropy",
        "distinct_2_pooled": "distinct-2 (pooled)",
        "repetitive": "repetitive (tokens)",
        "repetitive_words": "repetitive (words)",
        "eos_rate": "EOS rate",
        "length": "length",
    }
    lines = [
        f"Along training, per arm and {setting}: each held-out evaluation's numbers, mean over "
        "the seeds evaluated after that many updates (every run, counted or not).",
        "",
        f"| arm | {setting} | updates | seeds | " + " | ".join(names[s] for s in SIGNALS) + " |",
        "|---|---|---|---|" + "---|" * len(SIGNALS),
    ]
    for r in rows:
        cells = [_num(r[s], DIGITS.get(s, 3)) for s in SIGNALS]
        lines.append(
            f"| {r['algorithm']} | {r['value']:g} | {r['updates']} | {r['seeds']} | "
            + " | ".join(cells)
            + " |"
        )
    return _write(out, "collapse_along", rows, lines)


def plot(arms: list[Arm], setting: str, kls: list[float], point: str, out: Path) -> Path:
    """Every run's held-out trajectory (colour: arm, marker: value; dashed: not counted) and
    each arm's mean frontier over seeds at the matched KLs."""
    fig = Figure(figsize=(7.0, 5.0))
    ax = fig.subplots()
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    algorithms = sorted({a.algorithm for a in arms})
    values = sorted({a.value for a in arms})
    for arm in arms:
        colour = colours[algorithms.index(arm.algorithm) % len(colours)]
        marker = MARKERS[values.index(arm.value) % len(MARKERS)]
        ks, rs = zip(*arm.trajectory, strict=True)
        ax.plot(
            ks,
            rs,
            color=colour,
            marker=marker,
            ms=4,
            alpha=0.45,
            lw=1,
            ls="-" if arm.healthy else ":",
        )
    by_seed = seed_trajectories(arms)
    grid = sorted({0.0, *kls})
    for algorithm, seeds in sorted(by_seed.items()):
        colour = colours[algorithms.index(algorithm) % len(colours)]
        means = []
        for kl in grid:
            found = [v for ts in seeds.values() if (v := best_within(ts, kl)) is not None]
            means.append(sum(found) / len(found) if found else float("nan"))
        ax.plot(grid, means, color=colour, lw=2.5, label=f"{algorithm} frontier (mean)")
    for v, value in enumerate(values):
        ax.plot([], [], "k" + MARKERS[v % len(MARKERS)], ms=4, ls="", label=f"{setting} {value:g}")
    ax.set_xlabel("held-out KL(pi || pi_ref), summed over the answer")
    ax.set_ylabel("held-out task reward")
    ax.set_title(f"reward-KL frontier over {setting} ({point})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / "frontier.png"
    write_beside(png, lambda tmp: fig.savefig(tmp, dpi=110))
    return png


def report(
    paths: list[Path],
    setting: str,
    out: Path,
    point: str = "pioneer",
    baseline: str | None = None,
    at_kl: list[float] | None = None,
    baseline_point: str | None = None,
) -> list[Path]:
    """Read every run under ``paths`` and write the frontier's tables and figure to ``out``.
    ``baseline_point``: the baseline arm's point where it differs (PPO's pioneer against
    one of CORY's agents as pioneer)."""
    folders = run_folders(paths)
    algorithms = {path: load_run_config(path).algorithm for path in folders}
    base = pick_baseline(sorted(set(algorithms.values())), baseline)
    points = {
        path: (baseline_point or point) if algorithms[path] == base else point for path in folders
    }
    arms = [read_arm(path, setting, points[path]) for path in folders]
    kls = at_kl if at_kl else frontier_kls(arms)
    for note in kl_notes(arms, kls):
        print(note)
    title = point if baseline_point in (None, point) else f"{point}; {base}: {baseline_point}"
    out.mkdir(parents=True, exist_ok=True)
    return [
        *write_runs(arms, setting, out),
        *write_knob(arms, setting, out),
        *write_matched(arms, kls, base, out),
        *write_collapse(arms, setting, out),
        plot(arms, setting, kls, title, out),
    ]
