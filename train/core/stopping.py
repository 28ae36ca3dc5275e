"""Early stopping on the held-out evaluations: a run ends when a held-out number reaches a
target, or stops improving (transformers' ``EarlyStoppingCallback``: patience, threshold).

A leaf: it reads evaluation rows (``eval/<point>/<number>`` of ``metrics.jsonl``) and the
config's ``early_stopping_*`` settings, and says why to stop. The loop asks it after each
evaluation along training; a stopped run writes ``stopped.json`` into its folder, and a
resumed or swept run that finds it has nothing left to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "stopped.json"
"""The file a run stopped by its rule leaves in its folder."""
EVAL_KEY = "eval/updates"


@dataclass
class EarlyStopping:
    """The rule of a run and the evaluations it has seen (``(updates, value)``)."""

    metric: str = "pioneer/reward"
    target: float | None = None
    patience: int | None = None
    threshold: float = 0.0
    min_updates: int = 0
    seen: list[tuple[int, float]] = field(default_factory=list)

    @classmethod
    def of(cls, config: Any) -> EarlyStopping:
        return cls(
            metric=config.early_stopping_metric,
            target=config.early_stopping_target,
            patience=config.early_stopping_patience,
            threshold=config.early_stopping_threshold,
            min_updates=config.early_stopping_min_updates,
        )

    @property
    def enabled(self) -> bool:
        return self.target is not None or self.patience is not None

    def add(self, row: dict[str, Any]) -> str | None:
        """Take an evaluation row; why the run stops after it, or None to go on."""
        value = row.get(f"eval/{self.metric}")
        if value is None or EVAL_KEY not in row:
            return None
        updates = int(row[EVAL_KEY])
        self.seen.append((updates, float(value)))
        if not self.enabled or updates < self.min_updates:
            return None
        if self.target is not None and value >= self.target:
            return (
                f"the held-out {self.metric} reached {value:.3f} after {updates} updates "
                f"(early_stopping_target {self.target:g})"
            )
        if self.patience is not None and len(self.seen) > self.patience:
            values = [v for _, v in self.seen]
            before, last = max(values[: -self.patience]), max(values[-self.patience :])
            if last <= before + self.threshold:
                return (
                    f"the held-out {self.metric} did not rise above {before:.3f} by more "
                    f"than {self.threshold:g} in the last {self.patience} evaluations "
                    f"(after {updates} updates; early_stopping_patience)"
                )
        return None


def write_marker(run_path: Path, updates: int, reason: str) -> None:
    (Path(run_path) / MARKER).write_text(json.dumps({"updates": updates, "reason": reason}))


def stopped(run_path: Path) -> dict[str, Any] | None:
    """What ``stopped.json`` says (updates, reason), or None where the run did not stop."""
    file = Path(run_path) / MARKER
    return json.loads(file.read_text()) if file.is_file() else None
