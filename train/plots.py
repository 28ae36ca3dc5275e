"""Learning-curve plots from a run's ``metrics.jsonl`` (PNG, drawn on matplotlib ``Figure``
objects: no pyplot, so no backend is chosen on import).

``python train/plots.py RUN_DIR [RUN_DIR ...] --out curves.png`` compares runs.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from cory_rl.train.arguments import ArgumentParser
from cory_rl.train.files import write_beside
from cory_rl.train.run_folder import read_metrics

QUANTITIES = (("score", "task reward"), ("kl", "KL(pi || pi_ref)"), ("objective", "r - eta * KL"))


def _groups(rows: list[dict]) -> tuple[list[str], list[str]]:
    keys = {k.split("/")[0] for row in rows for k in row if k.endswith("/score")}
    roles = sorted(k for k in keys if k == "pioneer" or k.startswith("observer"))
    agents = sorted(k for k in keys if k.startswith("llm_"))
    return agents, roles


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["iteration"], r[key]) for r in rows if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(run_dir: Path) -> Path:
    """One figure: per agent (top row) and per role (bottom row), score / KL / objective."""
    rows = read_metrics(run_dir)
    agents, roles = _groups(rows)
    fig = Figure(figsize=(13, 6.5))
    axes = fig.subplots(2, 3, squeeze=False)
    for r, (title, names) in enumerate((("per agent", agents), ("per role", roles))):
        for c, (quantity, label) in enumerate(QUANTITIES):
            ax = axes[r][c]
            for name in names:
                xs, ys = _series(rows, f"{name}/{quantity}")
                ax.plot(xs, ys, label=name, linewidth=1.4)
            ax.set_title(f"{label} ({title})")
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
            if names:
                ax.legend(fontsize=8)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    write_beside(out, lambda tmp: fig.savefig(tmp, dpi=110))
    return out


def plot_compare(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Mean over agents of score, KL and objective for several runs on shared axes."""
    labels = labels or [Path(d).name for d in run_dirs]
    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    for run_dir, label in zip(run_dirs, labels, strict=False):
        rows = read_metrics(run_dir)
        agents, _ = _groups(rows)
        for ax, (quantity, title) in zip(axes, QUANTITIES, strict=False):
            for agent in agents:
                xs, ys = _series(rows, f"{agent}/{quantity}")
                ax.plot(xs, ys, label=f"{label} {agent}", linewidth=1.4)
            ax.set_title(title)
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_beside(out, lambda tmp: fig.savefig(tmp, dpi=110))
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="comparison PNG (default: each run's curves.png)")
    parser.add_argument("--labels", nargs="*")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        parser.error(f"--labels gives {len(args.labels)} labels for {len(args.runs)} runs")
    missing = [str(r) for r in args.runs if not (Path(r) / "config.yaml").is_file()]
    if missing:
        parser.error(f"not a run folder (no config.yaml): {', '.join(missing)}")
    try:
        if args.out is None:
            for run in args.runs:
                print(plot_run(run))
        else:
            print(plot_compare(args.runs, args.out, args.labels))
    except FileNotFoundError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
