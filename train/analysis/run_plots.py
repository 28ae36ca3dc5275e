"""Learning-curve plots from a run's ``metrics.jsonl`` (PNG, drawn on matplotlib ``Figure``
objects: no pyplot, so no backend is chosen on import).

``python train/plots.py RUN_DIR [RUN_DIR ...] --out curves.png`` compares runs.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from cory_rl.train.config.files import write_beside
from cory_rl.train.core.run_folder import read_metrics

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
