"""One module knows a run folder: its files, its metrics log, and its config.

A run folder holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one row per
iteration, and one per held-out evaluation marked by ``EVAL_KEY``), ``samples.jsonl``,
``tensorboard/``, ``checkpoint/`` (``cory_rl.train.core.checkpoint``), ``curves.png``, ``evals/``
and ``eval.json`` (``train/evaluate.py``). Compact copies of its results
(``cory_rl.train.core.results``) are read the same way.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from cory_rl.train.config.files import write_text
from cory_rl.train.config.resolve import build_config, load_config_file
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core import results
from cory_rl.train.core.checkpoint import find_checkpoint

RUN_OUTPUTS = frozenset(
    {
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "tensorboard",
        "curves.png",
        "checkpoint",
        "checkpoint.old",
        "checkpoint.tmp",
        "checkpoint.trash",
        "eval.json",
        "eval.md",
        "evals",
        "stopped.json",
    }
)
"""What a run writes into its folder; a folder holding anything else is never deleted."""


RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoint", "checkpoint.old")
"""The files whose presence means that a folder holds a run."""
EVAL_KEY = "eval/updates"
"""The key that marks a row of ``metrics.jsonl`` as a held-out evaluation, not an iteration."""
EVAL_FORMAT = 2
"""Version of ``eval.json``: 2 records every answer of a fixed evaluation set."""
EVALS_DIR = "evals"
"""The folder of the evaluations along training (``--eval_every``)."""


def eval_stem(updates: int) -> str:
    """The name (without suffix) of the evaluation along training after ``updates`` updates."""
    return f"updates_{updates:06d}"


def _rows(run_dir: Path) -> list[dict]:
    """The rows of ``metrics.jsonl`` (or of its compact copy, ``cory_rl.train.core.results``)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not results.exists(path):
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run folder?")
    return [json.loads(line) for line in results.read_text(path).splitlines() if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    """The training iterations' rows of a run's ``metrics.jsonl``."""
    return [row for row in _rows(run_dir) if EVAL_KEY not in row]


def read_evaluations(run_dir: Path) -> list[dict]:
    """The held-out evaluations' rows (``--eval_every``), by number of updates."""
    return sorted((r for r in _rows(run_dir) if EVAL_KEY in r), key=lambda r: r[EVAL_KEY])


def _iteration_of(line: str) -> int | None:
    """The iteration of a log row; None for a line a crash cut short."""
    try:
        return int(json.loads(line)["iteration"])
    except (ValueError, KeyError, TypeError):
        return None


class RunDirectory:
    """The files of one run: config, metrics, samples, TensorBoard, checkpoints, plots."""

    def __init__(self, path: Path, first_iteration: int = 0, tensorboard: bool = True) -> None:
        self.path = Path(path)
        self.writes_tensorboard = tensorboard
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_file = self.path / "metrics.jsonl"
        self.samples_file = self.path / "samples.jsonl"
        self.first_iteration = first_iteration
        self._tb = None

    @property
    def tensorboard(self) -> Any:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # On resume, purge_step drops the events a crashed run wrote after its checkpoint,
            # so TensorBoard shows each iteration once.
            purge = self.first_iteration if self.first_iteration > 0 else None
            self._tb = SummaryWriter(str(self.path / "tensorboard"), purge_step=purge)
        return self._tb

    def log_metrics(self, row: dict[str, Any]) -> None:
        """One row of ``metrics.jsonl`` and TensorBoard: an iteration's, or an evaluation's
        (TensorBoard step: the iteration, or the evaluation's number of updates)."""
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if not self.writes_tensorboard:
            return
        step = row.get(EVAL_KEY, row["iteration"])
        for key, value in row.items():
            if isinstance(value, (int, float)) and key not in ("iteration", EVAL_KEY):
                self.tensorboard.add_scalar(key, value, step)

    def log_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        with self.samples_file.open("a") as f:
            for sample in samples:
                f.write(json.dumps({"iteration": iteration, **sample}) + "\n")
        if self.writes_tensorboard:
            text = "\n\n".join(json.dumps(s, indent=1) for s in samples)
            self.tensorboard.add_text("samples", f"```\n{text}\n```", iteration)

    def truncate_logs(self, iteration: int) -> None:
        """On resume, drop log rows written after the checkpoint (they will be redone)."""
        for file in (self.metrics_file, self.samples_file):
            if file.exists():
                rows = [
                    line
                    for line in file.read_text().splitlines()
                    if (kept := _iteration_of(line)) is not None and kept < iteration
                ]
                write_text(file, "".join(r + "\n" for r in rows))

    def log_summary(self, values: dict[str, float], text: str, step: int) -> None:
        """The end-of-run summary to TensorBoard: ``summary/*`` scalars and its text."""
        if not self.writes_tensorboard:
            return
        self.first_iteration = 0  # a writer opened after the run must purge nothing
        for key, value in values.items():
            self.tensorboard.add_scalar(f"summary/{key}", value, step)
        self.tensorboard.add_text("summary", f"```\n{text}\n```", step)
        self.close()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def base_evaluation(path: Path) -> dict[str, Any] | None:
    """The evaluation before the first update (``--eval_every``): the base model's answers."""
    file = Path(path) / EVALS_DIR / f"{eval_stem(0)}.json"
    return json.loads(results.read_text(file)) if results.exists(file) else None


def evaluations_along(path: Path) -> list[dict[str, Any]]:
    """Every evaluation along training (``evals/``) of a run folder or its compact results,
    by number of updates."""
    names = {p.name.removesuffix(".gz") for p in (Path(path) / EVALS_DIR).glob("updates_*.json*")}
    files = [Path(path) / EVALS_DIR / name for name in sorted(names)]
    return [json.loads(results.read_text(file)) for file in files]


def final_evaluation(path: Path) -> dict[str, Any] | None:
    """The run's last held-out evaluation: ``eval.json``, else the last of ``evals/`` (of a
    run folder or its compact results); None where there is none. A file of another format
    than ``EVAL_FORMAT`` is refused, naming it."""
    path = Path(path)
    along = {p.name.removesuffix(".gz") for p in (path / EVALS_DIR).glob("updates_*.json*")}
    candidates = [path / "eval.json", *(path / EVALS_DIR / n for n in sorted(along, reverse=True))]
    for file in candidates:
        if not results.exists(file):
            continue
        evaluation = json.loads(results.read_text(file))
        if evaluation.get("format") != EVAL_FORMAT:
            raise ValueError(
                f"{file}: an evaluation of format {evaluation.get('format')!r}, not "
                f"{EVAL_FORMAT}; evaluate the run again with train/evaluate.py"
            )
        return evaluation
    return None


def has_checkpoint(run_path: Path) -> bool:
    """Whether the folder holds a complete checkpoint to resume from."""
    try:
        find_checkpoint(run_path)
    except FileNotFoundError:
        return False
    return True


class RunFolderBusy(FileExistsError):
    """Another run, still going, writes the folder."""


class RunLock:
    """One run writes a folder at a time: an exclusive ``flock`` on the folder itself, held
    while the run lasts. The kernel releases it when the process ends, however it ends, so
    a killed run never leaves a stale lock; a second run on a folder that a live run holds
    (another terminal, a launcher's orphaned workers) is refused before it writes anything.
    Where ``fcntl`` does not exist (Windows) there is no lock."""

    def __init__(self, path: Path) -> None:
        self.fd: int | None = None
        try:
            import fcntl
        except ImportError:
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunFolderBusy(
                f"{path} is being written by a run that is still going (in another terminal, "
                "or the processes of a launcher that was killed); wait for it to end or stop "
                "it, then run this again"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def clear_run_folder(path: Path, again: str = "rerun the sweep", locked: bool = False) -> None:
    """Empty a run folder that never reached a checkpoint (the folder itself stays, with
    any lock on it); refuse one holding files that no run writes. ``locked``: the caller
    holds the folder's :class:`RunLock` (a second one would wait on the first)."""
    foreign = sorted(p.name for p in path.iterdir() if p.name not in RUN_OUTPUTS)
    if foreign:
        raise FileExistsError(
            f"{path} has no checkpoint but holds files no run writes ({', '.join(foreign)}); "
            f"move them away or delete the folder, then {again}"
        )
    if not locked:  # a live run's folder is refused, never emptied
        RunLock(path).release()
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_run_path(run_path: Path, resume: bool) -> bool:
    """Refuse a folder that cannot take this run, before any model is loaded; True when it
    holds a run that stopped before its first checkpoint, which the new run clears
    (:func:`clear_stale_run`). Only reads the folder."""
    run_path = Path(run_path)
    if run_path.exists() and not run_path.is_dir():
        raise NotADirectoryError(f"run_dir {run_path} is a file, not a folder; pick another path")
    there = next(p for p in run_path.parents if p.exists())  # '.' or '/' at last
    if not there.is_dir():
        raise NotADirectoryError(
            f"run_dir {run_path}: {there} is a file, not a folder; pick another path"
        )
    if not os.access(there, os.W_OK | os.X_OK) and not run_path.exists():
        raise PermissionError(f"run_dir {run_path}: this user cannot write in {there}")
    if resume:
        if not run_path.is_dir():
            raise FileNotFoundError(f"--resume {run_path}: no such run folder")
        if not has_checkpoint(run_path):
            raise FileNotFoundError(
                f"--resume {run_path}: the run stopped before its first checkpoint, so there is "
                "nothing to resume; run the same command without --resume (and with --run_dir "
                f"{run_path}) to start it again in that folder"
            )
        return False
    held = [name for name in RUN_FILES if (run_path / name).exists()]
    if not held:
        return False
    if has_checkpoint(run_path):
        raise FileExistsError(
            f"{run_path} already holds a run ({', '.join(held)}); continue it with --resume "
            f"{run_path}, or pick a new --run_dir"
        )
    return True


def clear_stale_run(run_path: Path) -> None:
    """Start again in a folder whose run stopped before its first checkpoint: it holds
    nothing to resume (files that no run writes are never deleted: then it is refused).
    The caller holds the folder's lock."""
    print(f"{run_path} holds a run that stopped before its first checkpoint; starting it again")
    clear_run_folder(Path(run_path), again="start the run again", locked=True)


def load_run_config(run_dir: Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A run's saved config (its own algorithm), with ``overrides``."""
    config_file = Path(run_dir) / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run folder (it has no config.yaml)")
    algorithm = load_config_file(config_file).get("algorithm", "cory")
    return build_config(config_file=config_file, overrides=overrides, algorithm=algorithm)
