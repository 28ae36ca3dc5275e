"""Evaluate trained agents and their base model on a fixed set of held-out queries.

python train/evaluate.py RUN_DIR [RUN_DIR ...]      # writes RUN_DIR/eval.json and eval.md
python train/evaluate.py --task arith --samples 8   # the base model alone (--out DIR to keep it)

Held-out queries: what the task declares as its test split (``register_task(held_out=)``:
IMDB's and hub GSM8K's test split, the packaged IMDB openings' held-out fifth, arith drawn
with another generator seed minus any problem training could draw). The evaluation set is
every distinct one of them (or the first ``--max_queries``), each answered ``--samples``
times, with a token budget and sampling uniforms fixed per answer by ``--seed``
(``cory_rl.train.evaluation.eval_set``): the same set for every learner, batch size and
group size. Each
agent answers in every role, and the untrained base model plays the same games with the
same uniforms as the ``reference`` rows, so "reward - base" is a paired difference per
answer. ``eval.json`` keeps every
answer; ``cory_rl.train.evaluation.report`` computes every summary from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cory_env.checks import SettingError
from cory_rl.train.commands.parser import (
    ArgumentParser,
    output_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.commands.train_flags import flag_value
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.run_folder import load_run_config
from cory_rl.train.evaluation import cross_play as xp
from cory_rl.train.evaluation import report
from cory_rl.train.evaluation.evaluator import build_result, evaluate, write_eval


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("runs", nargs="*", type=Path, help="run folders to evaluate")
    parser.add_argument("--run", type=Path, action="append", default=[], help="same as RUN_DIR")
    parser.add_argument(
        "--algorithm",
        default="cory",
        choices=sorted(ALGORITHMS),
        help="without a run: the game the base model plays",
    )
    parser.add_argument("--task", help="without a run: the task (default imdb)")
    parser.add_argument("--model", help="without a run: the model (default embedded)")
    parser.add_argument("--preset", help="without a run: a training preset to start from")
    parser.add_argument("--max_new_tokens", type=flag_value)
    parser.add_argument(
        "--task_settings",
        type=flag_value,
        default=None,
        help="override the held-out task settings, e.g. '{split: train}'",
    )
    parser.add_argument(
        "--samples", type=int, help="answers per query (default: the run's eval_samples, 4)"
    )
    parser.add_argument("--max_queries", type=int, help="the first N distinct queries only")
    parser.add_argument("--batch_size", type=int, help="games per batch (default 32)")
    parser.add_argument("--seed", type=int, help="fixes budgets and uniforms (default 1234)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--show", type=int, default=3, help="sample exchanges kept per role")
    parser.add_argument("--no_reference", action="store_true", help="skip the base-model rows")
    parser.add_argument(
        "--out", type=output_folder, help="without a run: folder for eval.json/eval.md"
    )
    parser.add_argument(
        "--seats",
        type=flag_value,
        metavar="MAPPING",
        help="play a game of agents from any runs: {llm_0: RUN:AGENT, llm_1: base} (a player "
        "is RUN:AGENT, base, or a model folder); writes to --out",
    )
    parser.add_argument(
        "--cross_play",
        nargs="+",
        metavar="PLAYER",
        help="every agent of these runs (or each RUN:AGENT, model folder) and the base model as "
        "pioneer against every one as observer; writes cross_play.csv and .png to --out",
    )
    args = parser.parse_args(argv)
    runs = [*args.runs, *args.run]
    if args.seats is not None or args.cross_play:
        if runs or (args.seats is not None and args.cross_play):
            parser.error("--seats, --cross_play and run folders are three separate uses; give one")
        if args.out is None:
            parser.error("--seats and --cross_play write into --out DIR; give one")
        try:
            return [_play_players(args)]
        except (*USER_ERRORS, ValueError) as err:
            parser.error(one_line(err).removeprefix("error: "))
    options = {
        "samples": args.samples,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "max_queries": args.max_queries,
        "show": args.show,
        "reference": not args.no_reference,
        "task_settings": args.task_settings,
        "device": args.device,
    }
    results = []
    try:
        if not runs:
            overrides = {k: getattr(args, k) for k in ("task", "model", "max_new_tokens")}
            overrides = {k: v for k, v in overrides.items() if v is not None}
            config = build_config(args.preset, overrides=overrides, algorithm=args.algorithm)
            options["reference"] = True
            results.append(evaluate(config, None, **options))
            if args.out is not None:
                write_eval(args.out, results[-1])
        for run in runs:
            overrides = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
            results.append(evaluate(load_run_config(run, overrides), run, **options))
            write_eval(run, results[-1])
    except (*USER_ERRORS, ValueError) as err:
        parser.error(one_line(err).removeprefix("error: "))
    for result in results:
        print(report.to_markdown(result))
        for s in result["samples"].get("trained", result["samples"].get("reference", []))[:3]:
            print(json.dumps(s, ensure_ascii=False))
        if result["run"]:
            print(f"wrote {Path(result['run']) / 'eval.json'} and eval.md\n")
    return results


def _play_players(args: Any) -> dict[str, Any]:
    """``--seats`` (one game, written as eval.json) or ``--cross_play`` (the matrix)."""
    options = {
        "samples": args.samples,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "max_queries": args.max_queries,
    }
    if args.cross_play:
        cells = xp.cross_play(xp.run_players(args.cross_play), options)
        csv_path, png_path = xp.write_matrix(cells, args.out)
        print(f"wrote {csv_path} and {png_path}")
        return {"cross_play": cells}
    if not isinstance(args.seats, dict) or not args.seats:
        raise SettingError("--seats must be a mapping such as {llm_0: runs/a:llm_1, llm_1: base}")
    seats = {str(k): xp.Player.parse(v) for k, v in args.seats.items()}
    expected = [f"llm_{i}" for i in range(len(seats))]
    if sorted(seats) != expected:
        raise SettingError(f"--seats must name the seats {expected}, got {sorted(seats)}")
    seats = {seat: seats[seat] for seat in expected}
    template = xp.template_config(list(seats.values()), args.task)
    config, answers, evaluator = xp.play_seats(seats, template, options)
    result = build_result(evaluator, config, answers, common=True)
    result["seats"] = {seat: player.label for seat, player in seats.items()}
    result["references"] = dict(config.references or {})
    write_eval(args.out, result)
    print(report.to_markdown(result))
    print(f"seats: {result['seats']}\nwrote {args.out / 'eval.json'} and eval.md")
    return result


if __name__ == "__main__":
    main()
