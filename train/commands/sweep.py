"""Run a grid of training runs one after another: algorithms x one setting's values x seeds.

python train/sweep.py --algorithms ppo cory --setting init_kl_coef --values 0.05 0.1 0.2 \\
    --seeds 0 1 2 --preset cpu --out runs/sweep-kl --evaluate [any training flag]

Each grid point is a normal run folder ``OUT/<algorithm>-<setting>_<value>-seed_<seed>``.
Rerunning the same command continues the sweep: a finished run (checkpoint at its last
iteration) is skipped, a broken one (a checkpoint, not finished) resumes from it, and a
folder without a checkpoint (stopped before its first one) is cleared and started again.
Seeds are the outer loop, so a sweep cut short still covers the whole grid for the first
seeds. ``OUT/sweep.json`` lists the grid points and what happened to each.

``--results DIR`` writes each finished run's compact results (``cory_rl.train.core.results``) into
``DIR/<run name>``, and a point whose complete results are there is done: a study can
commit them as each run finishes (``--on_finish "git add {results} && git commit ..."``)
and continue on another machine, where the run folders are gone.

Several sweeps of the same command share its grid (two terminals, or machines that share
the folder): each holds the point it works on, from training to ``--on_finish``, and
passes over a point another live sweep or run holds. The kernel drops a killed sweep's
hold, so rerunning the command picks its point up again. The command with ``--status``
prints where each point stands and trains nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from cory_env.checks import SettingError
from cory_env.core import GAME_SETTINGS
from cory_rl.train.commands.parser import (
    ArgumentParser,
    number_at_least,
    output_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config import allocator
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.files import write_text
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import all_learner_settings, parse_yaml
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.checkpoint import checkpoint_updates, find_checkpoint, load_json_state
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.results import save_results, saved_iterations
from cory_rl.train.core.run_folder import (
    RunFolderBusy,
    RunLock,
    clear_run_folder,
    load_run_config,
)
from cory_rl.train.core.stopping import stopped
from cory_rl.train.evaluation.evaluator import evaluate_run
from cory_rl.train.training.run import run_training

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


def run_point(point: GridPoint, out: Path, train_flags: list[str], preset: str | None) -> str:
    """Train one grid point as far as the config asks; returns what was done."""
    path = out / point.name
    flags = [*(["--preset", preset] if preset else []), *train_flags, *point.flags(path)]
    wanted, _ = parse_args(flags, point.algorithm)
    state = run_state(path, wanted.iterations)
    if state == "finished":
        check_same_config(path, wanted)
        print(f"sweep: {point.name}: finished, skipped")
        return "skipped"
    if state == "broken":
        check_same_config(path, wanted)
        config = load_run_config(path, {"run_dir": str(path), "iterations": wanted.iterations})
        print(f"sweep: {point.name}: resuming from its checkpoint")
        run_training(config, resume_dir=path)
        return "resumed"
    status = "new"
    if state == "no_checkpoint":
        print(
            f"sweep: {point.name}: it stopped before its first checkpoint; emptying {path} "
            "and starting it again"
        )
        clear_run_folder(path)
        status = "restarted"
    print(f"sweep: {point.name}: training")
    run_training(wanted)
    return status


@contextmanager
def _sweep_file_lock(out: Path) -> Iterator[None]:
    """Serialise the read-modify-write of ``sweep.json`` between sweeps (none on Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    folder = out / HOLDS
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "sweep.json.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def write_record(out: Path, grid: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """Write this sweep's records into ``sweep.json``, keeping those other sweeps of the
    folder wrote; a point another sweep held ("busy") never replaces that sweep's record."""
    with _sweep_file_lock(out):
        file = out / SWEEP_FILE
        merged: dict[str, dict[str, Any]] = {}
        if file.is_file():
            try:
                merged = {r["name"]: r for r in json.loads(file.read_text())["runs"]}
            except (ValueError, KeyError, TypeError):  # unreadable: this sweep's view only
                merged = {}
        for record in runs:
            if record.get("status") != "busy" or record["name"] not in merged:
                merged[record["name"]] = record
        text = json.dumps({"grid": grid, "runs": list(merged.values())}, indent=1)
        write_text(file, text + "\n")


def hold_point(out: Path, point: GridPoint) -> RunLock | None:
    """This sweep's hold on a point for its whole turn (train, evaluate, save, on_finish),
    or None where another live sweep holds it."""
    try:
        return RunLock(out / HOLDS / point.name)
    except RunFolderBusy:
        return None


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


def after_run(command: str, point: GridPoint, results_dir: Path | None) -> None:
    """Run the user's ``--on_finish`` shell command (e.g. a git commit of the results);
    a failing command is reported, and the sweep goes on."""
    import subprocess

    where = "" if results_dir is None else str(results_dir / point.name)
    line = command.replace("{name}", point.name).replace("{results}", where)
    done = subprocess.run(line, shell=True, check=False)  # noqa: S602 - the user's own command
    if done.returncode != 0:
        print(f"sweep: --on_finish exited {done.returncode} after {point.name}: {line}")


def git_ignores(path: Path) -> bool:
    """Whether ``path`` lies in a git work tree that ignores it (False outside git)."""
    import subprocess

    probe = Path(path) / "done.json"
    try:
        done = subprocess.run(
            ["git", "check-ignore", "-q", str(probe)],
            capture_output=True,
            cwd=Path.cwd(),
            check=False,
        )
    except OSError:  # no git here
        return False
    return done.returncode == 0


def sweep(
    points: list[GridPoint],
    out: Path,
    train_flags: list[str],
    preset: str | None = None,
    evaluate: dict[str, Any] | None = None,
    results_dir: Path | None = None,
    on_finish: str | None = None,
) -> list[dict[str, Any]]:
    """Run every grid point in order; ``evaluate`` (options of ``evaluate_run``) evaluates
    each finished run that has no ``eval.json`` yet; ``results_dir`` receives each finished
    run's compact results and counts a point whose results are there as done; then
    ``on_finish`` runs. A failing run stops the sweep; a point another sweep or run holds
    is passed over ("busy")."""
    out.mkdir(parents=True, exist_ok=True)
    grid = {"points": len(points), "preset": preset, "train_flags": train_flags}
    runs: list[dict[str, Any]] = []
    for point in points:
        record = {**asdict(point), "name": point.name, "path": str(out / point.name)}
        if results_dir is not None and committed(point, train_flags, preset, results_dir):
            print(f"sweep: {point.name}: its results are in {results_dir}, skipped")
            runs.append({**record, "status": "committed"})
            write_record(out, grid, runs)
            continue
        hold = hold_point(out, point)
        if hold is None:
            print(f"sweep: {point.name}: another sweep is on it, passed over")
            runs.append({**record, "status": "busy"})
            write_record(out, grid, runs)
            continue
        try:
            _run_and_keep(point, record, out, train_flags, preset, evaluate, results_dir)
            runs.append(record)
            write_record(out, grid, runs)
            if on_finish and record["status"] != "busy":
                after_run(on_finish, point, results_dir)
        except BaseException:
            runs.append(record)
            write_record(out, grid, runs)
            raise
        finally:
            hold.release()
    busy = [r["name"] for r in runs if r["status"] == "busy"]
    if busy:
        print(
            f"sweep: {len(busy)} point(s) were another sweep's or run's ({', '.join(busy)}); "
            "rerun the command when they end to see the whole grid done"
        )
    return runs


def _run_and_keep(
    point: GridPoint,
    record: dict[str, Any],
    out: Path,
    train_flags: list[str],
    preset: str | None,
    evaluate: dict[str, Any] | None,
    results_dir: Path | None,
) -> None:
    """Train one held point, then evaluate it and save its results as asked; its status
    goes into ``record`` however it ends."""
    try:
        record["status"] = run_point(point, out, train_flags, preset)
    except RunFolderBusy:  # a run started by hand, not a sweep, writes the folder
        print(f"sweep: {point.name}: another run is writing its folder, passed over")
        record["status"] = "busy"
        return
    except (SettingError, ValueError, FileExistsError, SystemExit):
        print(f"sweep: {point.name}: refused (below); fix the command, then run it again")
        record["status"] = "refused"
        raise
    except BaseException:
        print(f"sweep: {point.name} stopped; rerun the same command to continue the sweep")
        record["status"] = "failed"
        raise
    finally:
        gc.collect()
    if evaluate is not None and not (out / point.name / "eval.json").exists():
        evaluate_run(out / point.name, **evaluate)
        record["evaluated"] = True
    if results_dir is not None:
        save_results(out / point.name, results_dir / point.name)
        record["results"] = str(results_dir / point.name)


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


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = ArgumentParser(
        description=summary(__doc__),
        epilog="Other flags are training flags (python train/cory.py --help), for every run.",
    )
    parser.add_argument("--algorithms", nargs="+", required=True, choices=sorted(ALGORITHMS))
    parser.add_argument("--seeds", nargs="+", type=number_at_least(0, integer=True), default=[0])
    parser.add_argument("--setting", help="the setting to vary, e.g. init_kl_coef or lam")
    parser.add_argument("--values", nargs="+", help="its values, as typed on the command line")
    parser.add_argument(
        "--per_algorithm",
        metavar="YAML",
        type=parse_yaml,
        default=None,
        help="settings of one algorithm's runs only, e.g. \"{ppo: {learning_rate: 1e-5}, "
        'cory: {learning_rate: 3e-5}}" (each arm at its own tuned rate)',
    )
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument(
        "--out", type=output_folder, help="sweep folder (default runs/sweep-<time>)"
    )
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="evaluate each finished run on the held-out set of its eval_* settings "
        "(training flags, e.g. --eval_samples 8)",
    )
    parser.add_argument(
        "--results",
        type=output_folder,
        help="write each finished run's compact results into RESULTS/<run name> (to commit); "
        "a point whose results are there is done, even where its run folder is not",
    )
    parser.add_argument(
        "--on_finish",
        metavar="COMMAND",
        help="a shell command run after each finished run, {name} and {results} replaced, "
        "e.g. \"git add {results} && git commit -qm 'study: {name}'\"",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print where each point of the sweep in --out stands (results kept, running, "
        "resumable, to do) and train nothing",
    )
    args, train_flags = parser.parse_known_args(argv)
    if args.status and args.out is None:
        parser.error("--status reads a sweep's folder: give its --out")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} | set(GAME_SETTINGS)
    if args.setting is not None and args.setting not in fields | all_learner_settings():
        parser.error(f"--setting {args.setting}: not a training setting")
    for flag in ("--algorithm", "--seed", "--run_dir", "--resume", "--config"):
        if any(f == flag or f.startswith(flag + "=") for f in train_flags):
            parser.error(f"{flag} is set by the sweep for each run; drop it")
    if args.setting is not None and any(f.startswith(f"--{args.setting}") for f in train_flags):
        parser.error(f"--{args.setting} is the swept setting; give its values with --values")
    try:
        per_algorithm = args.per_algorithm
        if per_algorithm is not None and not (
            isinstance(per_algorithm, dict)
            and all(isinstance(v, dict) for v in per_algorithm.values())
        ):
            raise ValueError("--per_algorithm takes {algorithm: {setting: value}}")
        points = make_grid(args.algorithms, args.seeds, args.setting, args.values, per_algorithm)
    except ValueError as err:
        parser.error(str(err))
    out = args.out or Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.results is not None and git_ignores(args.results):
        parser.error(
            f"--results {args.results}: git ignores that folder, so its results could "
            "not be committed; pick a folder git keeps (runs/ is ignored)"
        )
    if args.status:
        try:
            print_status(points, out, train_flags, args.preset, args.results)
        except (*USER_ERRORS, ValueError) as err:
            raise SystemExit(one_line(err)) from None
        return []
    evaluate = {} if args.evaluate else None
    if argv is None:  # from the command line: every run in this process, on the allocator
        allocator.relaunch(allocator.setting_in(train_flags))
    print(f"sweep: {len(points)} runs into {out}")
    try:
        runs = sweep(points, out, train_flags, args.preset, evaluate, args.results, args.on_finish)
    except (*USER_ERRORS, ValueError) as err:
        raise SystemExit(one_line(err)) from None
    print(f"sweep: done; compare with: python train/compare.py {out}")
    return runs


if __name__ == "__main__":
    main()
