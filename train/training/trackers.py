"""Experiment trackers: the run's config, every metrics row and the final summary, sent to
Weights & Biases, MLflow or Trackio through accelerate's tracker integrations.

``--report_to tensorboard,wandb`` (default ``tensorboard``; ``none`` for no tracker).
TensorBoard is written by the run folder itself (``RUN/tensorboard/``); the others are
accelerate's ``WandBTracker``, ``MLflowTracker`` and ``TrackioTracker``, each configured
by its library's own environment: ``WANDB_MODE=offline`` keeps a W&B run local,
``MLFLOW_TRACKING_URI`` picks the MLflow store (MLflow's default ``sqlite:///mlflow.db``;
a local file store such as ``file:./mlruns`` also needs ``MLFLOW_ALLOW_FILE_STORE=true``),
``TRACKIO_DIR`` Trackio's local database. Only the main process reports. Every
``sample_every`` iterations the games ``samples.jsonl`` gets go to each tracker as a
``completions`` table, one row per game and role (TRL's ``log_completions``): a W&B table,
an MLflow table artifact (``completions/iteration_NNNNNN.json``), a Trackio table;
TensorBoard gets them as text (``cory_rl.train.core.run_folder``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cory_rl.train.core.callbacks import Callback
from cory_rl.train.core.run_folder import EVAL_KEY

PROJECT = "cory"
COMPLETION_COLUMNS = ["iteration", "query", "role", "agent", "answer", "score", "reward"]


def completion_rows(iteration: int, samples: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per game and role of ``samples`` (the loop's ``batch_samples``)."""
    rows = []
    for sample in samples:
        for role, seat in sample.items():
            if isinstance(seat, dict) and "response" in seat:
                rows.append(
                    [
                        iteration,
                        sample.get("query"),
                        role,
                        seat.get("agent"),
                        seat["response"],
                        seat.get("score"),
                        seat.get("reward"),
                    ]
                )
    return rows


def flat_settings(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``section/key`` entries of the types trackers take."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_settings(value, f"{name}/"))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def make_tracker(name: str, run_name: str, run_path: Path) -> Any:
    """accelerate's tracker ``name`` for this run (started)."""
    from accelerate import tracking

    if name == "wandb":
        tracker = tracking.WandBTracker(PROJECT, name=run_name, dir=str(run_path))
    elif name == "mlflow":
        tracker = tracking.MLflowTracker(experiment_name=PROJECT, run_name=run_name)
    elif name == "trackio":
        tracker = tracking.TrackioTracker(PROJECT, name=run_name)
    else:
        raise ValueError(f"no tracker {name!r}")
    tracker.start()
    return tracker


class Trackers(Callback):
    """Reports a run to every tracker of ``report_to`` but TensorBoard: the config when the
    run starts, each ``metrics.jsonl`` row as it is logged (step: the iteration, or an
    evaluation's number of updates, as in TensorBoard), the summary when it ends."""

    def __init__(self, config: Any, run_path: Path) -> None:
        names = [n for n in config.report_to if n not in ("tensorboard", "none")]
        self.by_name = {n: make_tracker(n, Path(run_path).name, Path(run_path)) for n in names}
        self.step = 0
        for tracker in self.by_name.values():
            tracker.store_init_configuration(flat_settings(config.to_dict()))

    def on_row(self, row: dict[str, Any]) -> None:
        self.step = int(row.get(EVAL_KEY, row["iteration"]))
        values = {
            k: v
            for k, v in row.items()
            if isinstance(v, (int, float)) and k not in ("iteration", EVAL_KEY)
        }
        for tracker in self.by_name.values():
            tracker.log(values, step=self.step)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        """The games as a ``completions`` table, in each tracker's own table type."""
        rows = completion_rows(iteration, samples)
        if not rows:
            return
        for name, tracker in self.by_name.items():
            if name == "wandb":
                tracker.log_table(
                    "completions", columns=COMPLETION_COLUMNS, data=rows, step=iteration
                )
            elif name == "mlflow":
                import mlflow

                columns = {c: [r[i] for r in rows] for i, c in enumerate(COMPLETION_COLUMNS)}
                mlflow.log_table(
                    columns,
                    f"completions/iteration_{iteration:06d}.json",
                    run_id=tracker.active_run.info.run_id,
                )
            elif name == "trackio":
                import trackio

                table = trackio.Table(columns=COMPLETION_COLUMNS, data=rows)
                tracker.log({"completions": table}, step=iteration)

    def finish(self, summary: dict[str, float]) -> None:
        """Log the run's summary (``summary/*``) and close every tracker."""
        for tracker in self.by_name.values():
            tracker.log({f"summary/{k}": v for k, v in summary.items()}, step=self.step)
            tracker.finish()
