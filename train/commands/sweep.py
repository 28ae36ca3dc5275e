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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cory_env.checks import SettingError
from cory_env.core import GAME_SETTINGS
from cory_rl.train.commands.parser import (
    ArgumentParser,
    number_at_least,
    output_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.commands.sweep_grid import (
    HOLDS,
    SWEEP_FILE,
    GridPoint,
    check_same_config,
    committed,
    make_grid,
    print_status,
    run_state,
)
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config import allocator
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.files import write_text
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import all_learner_settings, parse_yaml
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.results import save_results
from cory_rl.train.core.run_folder import (
    RunFolderBusy,
    RunLock,
    clear_run_folder,
    load_run_config,
)
from cory_rl.train.evaluation.evaluator import evaluate_run
from cory_rl.train.training.run import run_training


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
