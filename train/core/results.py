"""A run's compact results, for committing: what every reported number is computed from.

``save_results(RUN, DEST)`` writes ``DEST/config.yaml``, the gzipped ``metrics.jsonl``
(training and evaluation rows) and every evaluation (``eval.json`` and ``evals/``) as
gzipped JSON without the per-cell rows (``cory_rl.train.evaluation.report`` recomputes them from the
answers, which are kept), then ``done.json`` last: a folder with it is complete. No
checkpoint and no TensorBoard: a run's results take a few hundred KB instead of GB.

``train/compare.py`` and ``train/plots.py`` read such a folder like a run folder, and
``train/sweep.py --results DIR`` counts a grid point whose results are there as done, so
a long study continues on another machine from what was committed.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

from cory_rl.train.config.files import write_beside

DONE = "done.json"
ENVIRONMENT_FILE = "environment.jsonl"
"""Where each start of the run ran (``cory_rl.train.core.environment``), kept with it."""
STOPPED = "stopped.json"
"""A run's early-stopping marker (``cory_rl.train.core.stopping``), copied with its results."""
DROPPED = ("rows",)
"""Keys of an evaluation left out of its compact copy (recomputed from its answers)."""


def _write_gzip(path: Path, text: str) -> None:

    def write(tmp: Path) -> None:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
            f.write(text)

    write_beside(path, write)


def read_text(path: Path) -> str:
    """A file's text, or that of ``path.gz`` when only the compact copy exists."""
    path = Path(path)
    if path.exists():
        return path.read_text()
    with gzip.open(path.with_name(path.name + ".gz"), "rt", encoding="utf-8") as f:
        return f.read()


def exists(path: Path) -> bool:
    """Whether ``path`` or its compact copy ``path.gz`` exists."""
    path = Path(path)
    return path.exists() or path.with_name(path.name + ".gz").exists()


def compact_evaluation(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The evaluation without what is recomputed, naming its run by folder name (results
    are committed: they say which run, not where it lived)."""
    compact = {k: v for k, v in evaluation.items() if k not in DROPPED}
    if compact.get("run"):
        compact["run"] = Path(compact["run"]).name
    return compact


def _config_text(run_path: Path) -> str:
    """The run's ``config.yaml`` with ``run_dir`` as the run folder's name."""
    text = (run_path / "config.yaml").read_text()
    return re.sub(r"^run_dir: .*$", f"run_dir: {run_path.name}", text, count=1, flags=re.M)


def save_results(run_path: Path, dest: Path) -> Path:
    """Write the compact results of the run folder ``run_path`` into ``dest``."""
    run_path, dest = Path(run_path), Path(dest)
    (dest / "evals").mkdir(parents=True, exist_ok=True)
    (dest / DONE).unlink(missing_ok=True)  # incomplete until written again, last
    (dest / "config.yaml").write_text(_config_text(run_path))
    metrics = (run_path / "metrics.jsonl").read_text()
    _write_gzip(dest / "metrics.jsonl.gz", metrics)
    files = ["config.yaml", "metrics.jsonl.gz"]
    evaluations = sorted((run_path / "evals").glob("updates_*.json"))
    if (run_path / "eval.json").exists():
        evaluations.append(run_path / "eval.json")
    for source in evaluations:
        name = str(source.relative_to(run_path)) + ".gz"
        compact = compact_evaluation(json.loads(source.read_text()))
        _write_gzip(dest / name, json.dumps(compact))
        files.append(name)
    if (run_path / ENVIRONMENT_FILE).is_file():  # where it ran (an older run has none)
        shutil.copyfile(run_path / ENVIRONMENT_FILE, dest / ENVIRONMENT_FILE)
        files.append(ENVIRONMENT_FILE)
    if (run_path / STOPPED).is_file():  # the run ended by its early-stopping rule
        shutil.copyfile(run_path / STOPPED, dest / STOPPED)
        files.append(STOPPED)
    rows = [json.loads(line) for line in metrics.splitlines() if line.strip()]
    iterations = max((int(r["iteration"]) + 1 for r in rows), default=0)
    done = {"run": run_path.name, "iterations": iterations, "files": files}
    (dest / DONE).write_text(json.dumps(done, indent=1) + "\n")
    return dest


def saved_iterations(dest: Path) -> int | None:
    """Iterations of the complete results in ``dest``; None if there are none."""
    marker = Path(dest) / DONE
    if not marker.is_file():
        return None
    return int(json.loads(marker.read_text())["iterations"])
