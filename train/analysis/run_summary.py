"""The few lines printed when a run ends: what it learned, what it cost, where it lies."""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.core.health import MIN_UPDATES, UNHEALTHY_SHARE, Band, HealthWatch
from cory_rl.train.core.run_folder import read_evaluations, read_metrics

SHORT = 10
"""Runs of fewer iterations are said to test the plumbing only (the smoke preset has 3)."""


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def summary_values(run_path: Path, rows: list[dict] | None = None) -> dict[str, float]:
    """The summary's numbers (for trackers): each agent's last score and KL, seconds per
    iteration after the first, peak memory, and the last held-out reward and KL.
    ``rows``: the run's metrics rows, when the caller has read them already."""
    rows = read_metrics(run_path) if rows is None else rows
    if not rows:
        return {}
    last = rows[-1]
    out = {
        k: float(v)
        for k, v in last.items()
        if k.startswith("llm_") and k.endswith(("/score", "/kl"))
    }
    times = [r["time/iteration_s"] for r in rows[1:]] or [rows[0]["time/iteration_s"]]
    out["seconds_per_iteration"] = sum(times) / len(times)
    out["peak_memory_gb"] = max(r.get("memory/peak_mb", 0.0) for r in rows) / 1024
    out["iterations"] = float(len(rows))
    health = HealthWatch().add_all(rows)
    if health.updates:
        out["updates_outside_health_band"] = health.unhealthy_share
    evaluations = read_evaluations(run_path)
    if evaluations:
        for key in ("eval/all/reward", "eval/all/kl"):
            if key in evaluations[-1]:
                out[key.replace("eval/all/", "held_out_")] = float(evaluations[-1][key])
    return out


def run_summary(run_path: Path, band: Band | None = None) -> str:
    """First and last task score and KL per agent, update health (``band``: the healthy
    one, cory_rl.train.core.health), s/iteration, peak memory, folder, disk."""
    run_path = Path(run_path)
    rows = read_metrics(run_path)
    if not rows:
        return f"run folder: {run_path} (no iterations logged)"
    first, last = rows[0], rows[-1]
    agents = sorted({k.split("/")[0] for k in first if k.startswith("llm_")})
    lines = [f"run summary ({len(rows)} iterations, {first['iteration']}..{last['iteration']})"]
    lines.append(f"  {'agent':<8} {'score first -> last':>22} {'KL first -> last':>22}")
    for agent in agents:
        s0, s1 = first.get(f"{agent}/score", float("nan")), last.get(f"{agent}/score", 0.0)
        k0, k1 = first.get(f"{agent}/kl"), last.get(f"{agent}/kl")
        kl = "n/a (no reference)" if k0 is None or k1 is None else f"{k0:>10.3f} -> {k1:<9.3f}"
        lines.append(f"  {agent:<8} {s0:>+10.3f} -> {s1:<+9.3f} {kl}")
    health = HealthWatch(band).add_all(rows)
    if health.updates:
        lines.append("  update health (per token, to the policy that acted):")
        lines.append(health.summary())
        warning = health.warning()
        if warning:
            lines.append(f"  {warning}")
        elif not health.judged:
            lines.append(
                f"  too few updates to judge their health (it takes {MIN_UPDATES} per agent): "
                "the counts above are for reading, not for changing settings"
            )
        elif health.unhealthy_share:
            lines.append(
                f"  {health.unhealthy_share:.0%} of the updates were outside the healthy band "
                f"(a warning takes over {UNHEALTHY_SHARE:.0%})"
            )
        else:
            lines.append("  the updates stayed inside the healthy band")
    numbers = summary_values(run_path, rows)
    lines.append(
        f"  {numbers['seconds_per_iteration']:.1f} s/iteration (after the first), "
        f"peak memory {numbers['peak_memory_gb']:.1f} GB"
    )
    evaluations = read_evaluations(run_path)
    if evaluations:
        first_eval, last_eval = evaluations[0], evaluations[-1]
        lines.append(
            f"  held-out reward {first_eval['eval/all/reward']:+.3f} -> "
            f"{last_eval['eval/all/reward']:+.3f}, KL {first_eval.get('eval/all/kl', 0.0):.3f} -> "
            f"{last_eval.get('eval/all/kl', 0.0):.3f} ({len(evaluations)} evaluations, "
            f"updates {first_eval['eval/updates']}..{last_eval['eval/updates']}; RUN/evals/)"
        )
    checkpoint = run_path / "checkpoint"
    ckpt = ""
    if checkpoint.exists():
        ckpt = f", of which checkpoint/ {human_bytes(folder_bytes(checkpoint))}"
    lines.append(
        f"  run folder: {run_path} ({human_bytes(folder_bytes(run_path))} on disk{ckpt}; "
        "metrics.jsonl, samples.jsonl, curves.png, tensorboard/, checkpoint/)"
    )
    lines.append(
        "  score: the task's reward of each answer, mean over the batch (IMDB: the sentiment of "
        "query + answer); KL: to the frozen reference, summed over the answer"
    )
    if len(rows) < SHORT:
        lines.append(
            f"  {len(rows)} iterations test the plumbing, they are too few to learn: scores "
            "move by chance. For learning, try --preset cpu"
        )
    lines.append(
        f"  next: python train/evaluate.py {run_path} (held-out evaluation), python "
        f"train/export.py {run_path} OUT (Hugging Face folders); the checkpoint is only needed "
        f"to resume, evaluate or export: delete {checkpoint} when done"
    )
    return "\n".join(lines)
