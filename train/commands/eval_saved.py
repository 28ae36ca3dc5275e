"""Held-out evaluations of model folders saved along a run made elsewhere, as a run folder.

cory-eval-saved SAVED --like RUN --seed 0 --out DIR

``SAVED`` holds ``updates_<n>/llm_<i>`` plain model folders (what the official loop of
the peers writes with ``--save_every``). Each ``updates_<n>`` is played on the held-out set
of the run ``RUN`` (same task, game, samples, budgets and sampling uniforms), every seat in
every role, exactly as ``--eval_every`` evaluates a run of ours: ``updates_000000`` is the
``reference`` that every later evaluation is paired with, and each folder's KL is measured
against ``RUN``'s base model. ``DIR`` then reads like one of our runs to
``train/compare.py``: ``config.yaml`` (``RUN``'s, with ``--seed``), ``evals/`` and the
evaluation rows of ``metrics.jsonl``; ``source.json`` says where the folders came from.
An evaluation already in ``DIR`` is read back, not played again, so a later call picks up
where an earlier one stopped, or follows a run that is still saving. ``--results DEST``
also writes the compact copy to commit (``cory_rl.train.core.results``), with the log and source.
The paths are recorded as given: name ``SAVED`` and ``DIR`` relative to the working tree
(``runs/...``) so that committed results name no machine's folders.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from cory_env.checks import SettingError
from cory_rl.train.commands.parser import (
    ArgumentParser,
    existing_folder,
    output_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.config.files import write_text
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.results import save_results
from cory_rl.train.core.run_folder import EVALS_DIR, eval_stem, load_run_config
from cory_rl.train.evaluation import report
from cory_rl.train.evaluation.along import metrics_row
from cory_rl.train.evaluation.cross_play import Player, play_seats
from cory_rl.train.evaluation.evaluator import build_result, write_eval

SAVED_PATTERN = re.compile(r"updates_(\d+)")


def saved_updates(saved: Path) -> dict[int, Path]:
    """``updates_<n>`` folders of ``saved`` by n; the first must be the base (n = 0)."""
    found = {
        int(m.group(1)): path
        for path in Path(saved).iterdir()
        if path.is_dir() and (m := SAVED_PATTERN.fullmatch(path.name))
    }
    if 0 not in found:
        raise SettingError(
            f"{saved}: no updates_000000 folder (the models before the first update), which "
            "every later evaluation is paired with; save it (official_loop.py --save_every N "
            f"does) and run again. Found: {sorted(found) or 'no updates_<n> folders'}"
        )
    return dict(sorted(found.items()))


def seats_of(folder: Path, agents: list[str]) -> dict[str, Any]:
    """The players of one ``updates_<n>`` folder: one model folder per agent of the run."""
    missing = [agent for agent in agents if not (folder / agent / "config.json").is_file()]
    if missing:
        raise SettingError(
            f"{folder}: no model folder for {missing} (the run to evaluate like has agents "
            f"{agents}); pass --like a run of the same game"
        )
    return {agent: Player(str(folder / agent), model=str(folder / agent)) for agent in agents}


def evaluate_saved(
    saved: Path,
    like: Path,
    out: Path,
    seed: int,
    options: dict[str, Any] | None = None,
    updates: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate every ``updates_<n>`` of ``saved`` (or those of ``updates``, with 0) as
    ``like`` evaluates its own; the rows."""
    template = load_run_config(like, {"device": "cpu"})
    folders = saved_updates(saved)
    if updates is not None:
        missing = sorted(set(updates) - set(folders))
        if missing:
            raise SettingError(
                f"{saved}: no updates_<n> folder for {missing}; it has {sorted(folders)}"
            )
        folders = {n: path for n, path in folders.items() if n == 0 or n in updates}
    out = Path(out)
    (out / EVALS_DIR).mkdir(parents=True, exist_ok=True)
    template.seed, template.run_dir = seed, str(out)
    template.save(out / "config.yaml")
    log = Path(saved) / "log.jsonl"
    if log.is_file():
        shutil.copyfile(log, out / "log.jsonl")
    source = {"saved": str(saved), "like": str(like), "updates": sorted(folders)}
    write_text(out / "source.json", json.dumps(source, indent=1) + "\n")
    rows, base = [], None
    for n, folder in folders.items():
        model = report.REFERENCE if n == 0 else report.TRAINED
        done = out / EVALS_DIR / f"{eval_stem(n)}.json"
        if done.is_file():  # evaluated by an earlier call: a run still saving is resumed
            result = json.loads(done.read_text())
            base = result["answers"] if n == 0 else base
            rows.append(metrics_row(result, model, n))
            continue
        seats = seats_of(folder, list(template.agents))
        config, answers, evaluator = play_seats(seats, template, options, model=model)
        result = build_result(
            evaluator, config, answers, run_dir=out, updates=n, base=base, common=True
        )
        result["seats"] = {seat: player.label for seat, player in seats.items()}
        result["references"] = dict(config.references or {})
        write_eval(out / EVALS_DIR, result, eval_stem(n))
        base = answers if n == 0 else base
        rows.append(metrics_row(result, model, n))
        write_text(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
        print(f"updates {n}: {_headline(rows[-1])}", flush=True)
    # every row, those read back too: calls that each played some of the folders (a run
    # still saving, two processes) leave one complete log
    write_text(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _headline(row: dict[str, Any]) -> str:
    reward, kl = row.get("eval/all/reward"), row.get("eval/all/kl")
    return f"held-out reward {reward:.3f}, KL {kl:.3f} (all roles)" if reward is not None else ""


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument(
        "saved", type=existing_folder, help="folder of updates_<n>/llm_<i> model folders"
    )
    parser.add_argument(
        "--like",
        type=existing_folder,
        required=True,
        help="a run folder of ours whose game and held-out set to use",
    )
    parser.add_argument("--seed", type=int, required=True, help="the seed the saved run used")
    parser.add_argument(
        "--out", type=output_folder, required=True, help="the run-like folder to write"
    )
    parser.add_argument("--results", type=output_folder, help="also its compact results, to commit")
    parser.add_argument(
        "--updates",
        type=int,
        nargs="+",
        metavar="N",
        help="only these updates_<n> folders (and updates_000000)",
    )
    args = parser.parse_args(argv)
    try:
        rows = evaluate_saved(args.saved, args.like, args.out, args.seed, updates=args.updates)
    except USER_ERRORS as err:  # a folder that is no run, no updates_000000, a model missing
        parser.error(one_line(err).removeprefix("error: "))
    if args.results is not None:
        save_results(args.out, args.results)
        for name in ("log.jsonl", "source.json"):
            if (args.out / name).is_file():
                shutil.copyfile(args.out / name, args.results / name)
        print(f"compact results in {args.results}")
    return rows


if __name__ == "__main__":
    main()
