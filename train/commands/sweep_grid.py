"""The sweep's grid and where each of its points stands: the points (algorithm, the swept
setting's value, seed), the state of a point's run folder and of its kept results, and the
``--status`` table. ``train/commands/sweep.py`` runs them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config.resolve import parse_yaml
from cory_rl.train.core.checkpoint import checkpoint_updates, find_checkpoint, load_json_state
from cory_rl.train.core.errors import one_line
from cory_rl.train.core.results import saved_iterations
from cory_rl.train.core.run_folder import RunFolderBusy, RunLock, load_run_config
from cory_rl.train.core.stopping import stopped

SWEEP_FILE = "sweep.json"
HOLDS = ".holds"
"""Under OUT: one folder per point a sweep is working on (its lock), shared by sweeps."""


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep."""

    algorithm: str
    seed: int
    setting: str | None = None
    value: str | None = None
    """As typed on the command line (it names the folder; the config parses it)."""
    extra: tuple[str, ...] = ()
    """Training flags of this algorithm only (``--per_algorithm``)."""

    @property
    def name(self) -> str:
        varied = f"-{self.setting}_{self.value}" if self.setting is not None else ""
        return f"{self.algorithm}{varied}-seed_{self.seed}"

    def flags(self, run_dir: Path) -> list[str]:
        """The training flags of this point."""
        flags = ["--algorithm", self.algorithm, "--seed", str(self.seed), "--run_dir", str(run_dir)]
        if self.setting is not None:
            flags += [f"--{self.setting}={self.value}"]
        return flags + list(self.extra)


def make_grid(
    algorithms: list[str],
    seeds: list[int],
    setting: str | None,
    values: list[str] | None,
    per_algorithm: dict[str, dict[str, Any]] | None = None,
) -> list[GridPoint]:
    """Seeds outermost, then the setting's values, then the algorithms. ``per_algorithm``:
    settings of one algorithm's runs only (each arm at its own learning rate)."""
    if (setting is None) != (not values):
        raise ValueError("--setting and --values go together: name a setting and its values")
    per_algorithm = per_algorithm or {}
    unknown = sorted(set(per_algorithm) - set(algorithms))
    if unknown:
        raise ValueError(f"--per_algorithm names {unknown}, which --algorithms does not run")
    if setting is not None and any(setting in s for s in per_algorithm.values()):
        raise ValueError(f"--per_algorithm sets {setting}, the swept setting")
    extra = {
        algorithm: tuple(f"--{k}={_flag_value(v)}" for k, v in settings.items())
        for algorithm, settings in per_algorithm.items()
    }
    return [
        GridPoint(algorithm, seed, setting, value, extra.get(algorithm, ()))
        for seed in seeds
        for value in (values or [None])
        for algorithm in algorithms
    ]


def _flag_value(value: Any) -> str:
    """A setting's value as a flag takes it: numbers and text as typed, the rest as YAML."""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def run_state(path: Path, iterations: int) -> str:
    """``new``, ``finished``, ``broken`` (resumable) or ``no_checkpoint`` (start again)."""
    if not path.exists() or not any(path.iterdir()):
        return "new"
    try:
        folder = find_checkpoint(path)
    except FileNotFoundError:
        return "no_checkpoint"
    done = int(load_json_state(folder)["iteration"])
    return "finished" if done >= iterations - 1 or stopped(path) else "broken"


def _comparable(values: dict[str, Any]) -> dict[str, Any]:
    """A config's values as its YAML file holds them, minus what a sweep call may change."""
    plain = parse_yaml(yaml.safe_dump(values, sort_keys=False))
    for section in ("game", "learner"):  # so that the message says which setting differs
        plain.update({f"{section}.{k}": v for k, v in (plain.pop(section, None) or {}).items()})
    return {k: v for k, v in plain.items() if k not in ("iterations", "run_dir", "report_to")}


def check_same_config(path: Path, wanted: Any) -> None:
    """A folder of this sweep must hold a run of this grid point's config. The saved config
    is read as a run reads it (defaults filled in, numbers in their declared types)."""
    saved = _comparable(load_run_config(path).to_dict())
    want = _comparable(wanted.to_dict())
    differ = sorted(k for k in set(saved) | set(want) if saved.get(k) != want.get(k))
    if differ:
        raise ValueError(
            f"{path} holds a run of another config (it differs in {', '.join(differ)}); "
            "rerun the sweep with the flags it was started with, or pick another --out"
        )


def committed(
    point: GridPoint, train_flags: list[str], preset: str | None, results_dir: Path
) -> bool:
    """Whether ``results_dir`` holds complete results of this grid point's config, as long
    as asked (``cory_rl.train.core.results``): then the point is done, wherever its run
    folder is."""
    dest = results_dir / point.name
    saved = saved_iterations(dest)
    if saved is None:
        return False
    flags = [*(["--preset", preset] if preset else []), *train_flags, *point.flags(dest)]
    wanted, _ = parse_args(flags, point.algorithm)
    check_same_config(dest, wanted)
    return saved >= wanted.iterations or stopped(dest) is not None


def _held(folder: Path) -> bool:
    """Whether a live process holds ``folder``'s lock; a folder that is not there is not
    held (and is not made)."""
    if not folder.is_dir():
        return False
    try:
        RunLock(folder).release()
    except RunFolderBusy:
        return True
    return False


def _last_iteration(path: Path) -> int | None:
    """The last training iteration a run folder's ``metrics.jsonl`` logged."""
    file = path / "metrics.jsonl"
    if not file.is_file():
        return None
    last = None
    for line in file.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line being written
            continue
        if isinstance(row, dict) and "time/iteration_s" in row:
            last = row.get("iteration", last)
    return last


def point_state(
    point: GridPoint,
    out: Path,
    train_flags: list[str],
    preset: str | None,
    results_dir: Path | None,
) -> str:
    """Where one grid point stands, in words; reads the folders and trains nothing."""
    path = out / point.name
    flags = [*(["--preset", preset] if preset else []), *train_flags, *point.flags(path)]
    iterations = parse_args(flags, point.algorithm)[0].iterations
    if results_dir is not None:
        try:
            if committed(point, train_flags, preset, results_dir):
                ended = stopped(results_dir / point.name)
                done = saved_iterations(results_dir / point.name)
                how = f"stopped: {ended.get('reason', 'early')}" if ended else "all updates"
                return f"results kept: {done} updates; {how}"
        except ValueError as err:
            return f"results of another config ({one_line(err)})"
    if _held(out / HOLDS / point.name) or _held(path):
        last = _last_iteration(path)
        where = "starting" if last is None else f"update {last + 1} of {iterations} logged"
        return f"running ({where})"
    state = run_state(path, iterations)
    if state == "broken":
        return f"resumes from update {checkpoint_updates(path)} of {iterations}"
    return {
        "new": "to do",
        "finished": "finished (results not kept yet)",
        "no_checkpoint": "stopped before its first checkpoint (starts again)",
    }[state]


def print_status(
    points: list[GridPoint],
    out: Path,
    train_flags: list[str],
    preset: str | None,
    results_dir: Path | None,
) -> dict[str, str]:
    """A table of the grid's points and where each stands (``--status``)."""
    states = {p.name: point_state(p, out, train_flags, preset, results_dir) for p in points}
    width = max(len(name) for name in states)
    for name, state in states.items():
        print(f"{name:<{width}}  {state}")
    return states
