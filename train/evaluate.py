"""Evaluate trained agents and their base model on a fixed set of held-out queries.

python train/evaluate.py RUN_DIR [RUN_DIR ...]      # writes RUN_DIR/eval.json and eval.md
python train/evaluate.py --task arith --samples 8   # the base model alone (--out DIR to keep it)

Held-out queries: what the task declares as its test split (``register_task(held_out=)``:
IMDB's and hub GSM8K's test split, the packaged IMDB openings' held-out fifth, arith drawn
with another generator seed minus any problem training could draw). The evaluation set is
every distinct one of them (or the first ``--max_queries``), each answered ``--samples``
times, with a token budget and sampling uniforms fixed per answer by ``--seed``
(``train/eval_set.py``): the same set for every learner, batch size and group size. Each
agent answers in every role, and the untrained base model plays the same games with the
same uniforms as the ``reference`` rows, so "reward - base" is a paired difference per
answer. ``eval.json`` keeps every
answer; ``train/eval_report.py`` computes every summary from them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agents.base import CommonNoise, Exportable
from cory_env.tasks import held_out_split
from train import eval_report as report
from train import metrics
from train.arguments import ArgumentParser
from train.eval_set import EvalSet, padded
from train.run_folder import load_run_config, write_text

FORMAT = 2
"""Version of ``eval.json``: 2 records every answer of a fixed evaluation set."""
BASE_MODEL, UNTRAINED = "the base model", "an untrained copy of the learner (no base model)"
"""What the ``reference`` rows of a seat are (``eval.json["reference_is"]``)."""


def drop_training_queries(game: Any, config: Any) -> int:
    """Remove evaluation queries that training also draws (a task's generated problems)."""
    from cory_env.tasks import make_task

    seen = {q.text for q in make_task(config.task, **config.task_settings).queries}
    kept = [q for q in game.task.queries if q.text not in seen]
    if not kept:
        raise ValueError(
            f"every held-out {config.task} query also occurs in training; raise n_queries"
        )
    dropped = len(game.task.queries) - len(kept)
    game.task.queries = kept
    return dropped


class Evaluator:
    """Plays the fixed evaluation set (``train/eval_set.py``) with any learners.

    Built once per run (the held-out task, its game and the set); :meth:`play` then
    answers the whole set with the given learners, every agent in every role, and returns
    one record per answer (``train/eval_report.ANSWER_COLUMNS``). Learners that take
    common random numbers (``agents.base.CommonNoise``) draw each answer's tokens with
    the set's uniforms for that (query, sample, role), and go back to their own random
    stream afterwards, which evaluation never advances: a run trains the same with or
    without evaluations along the way.
    """

    def __init__(
        self,
        config: Any,
        tokenizers: Any,
        *,
        samples: int = 4,
        batch_size: int = 32,
        seed: int = 1234,
        max_queries: int | None = None,
        task_settings: dict[str, Any] | None = None,
    ) -> None:
        from train.loop import make_game

        split = held_out_split(config.task, config.task_settings)
        self.note, self.held_out = split.note, split.held_out
        settings = {**split.settings, **(task_settings or {})}
        self.task_settings = settings
        game = make_game(config, tokenizers, task_settings=settings, group_size=1, batch_size=1)
        if split.minus_training and self.held_out:
            dropped = drop_training_queries(game, config)
            self.note += f" ({dropped} of them dropped)"
        self.eval_set = EvalSet.build(
            [q.text for q in game.task.queries], samples, seed,
            (game.budget_low, game.budget_high), max_queries,
        )  # fmt: skip
        size, self.batches = self.eval_set.batches(batch_size)
        self.items = self.eval_set.items()  # (query, sample) of every answer, computed once
        self.budgets = self.eval_set.budgets()
        self.game = make_game(config, tokenizers, task=game.task, group_size=1, batch_size=size)
        self.checked = _answer_checked(self.game)

    @property
    def n_batches(self) -> int:
        """Batches one model plays: every batch of the set in every role order."""
        return self.game.n_agents * len(self.batches)

    def size_line(self, models: int = 1) -> str:
        """What one evaluation plays, said before it starts."""
        es = self.eval_set
        orders = self.game.n_agents
        return (
            f"evaluation: {len(es.texts)} held-out queries x {es.samples} samples = "
            f"{len(es.texts) * es.samples} answers per role order, {orders} role order"
            f"{'s' if orders > 1 else ''}, {models} model{'s' if models > 1 else ''}: "
            f"{models * self.n_batches} batches of {self.game.batch_size} games "
            f"(--max_queries and --samples make it smaller)"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "held_out": {
                "held_out": self.held_out, "note": self.note, "task_settings": self.task_settings
            },
            "eval_set": self.eval_set.describe(),
            "answer_checked": self.checked,
        }  # fmt: skip

    def play(
        self, learners: dict[str, Any], model: str, show: int = 3, progress: Any = None
    ) -> tuple[dict[str, list[Any]], list[dict[str, Any]], list[float], bool]:
        """Every answer of ``learners`` to the set, in every role; the first ``show``
        exchanges of each role rotation; the MoE score per game (two value heads); and
        whether every learner drew with the set's common random numbers. ``progress``, a
        tqdm bar, advances by one per batch."""
        from train.loop import batch_samples

        answers = report.empty_answers()
        shown: list[dict[str, Any]] = []
        moe: list[float] = []
        period = self.game.settings.role_exchange_period
        try:
            for shift in range(self.game.n_agents):
                for number, items in enumerate(self.batches):
                    moe += self._play_batch(learners, model, shift * period, items, answers)
                    if number == 0:
                        shown += batch_samples(self.game, min(show, len(items)))
                    if progress is not None:
                        progress.update(1)
        finally:
            for learner in learners.values():
                if isinstance(learner, CommonNoise):
                    learner.use_sampling_noise(None)
        common = all(isinstance(learner, CommonNoise) for learner in learners.values())
        return answers, shown, moe, common

    def _play_batch(
        self,
        learners: dict[str, Any],
        model: str,
        episode: int,
        items: np.ndarray,
        answers: dict[str, list[Any]],
    ) -> list[float]:
        """One batch of the set's answers (``items``) in the roles of ``episode``; returns
        the MoE score of each game when two seats report values."""
        from train.loop import play_games

        game, es = self.game, self.eval_set
        queries, samples = (column[padded(items, game.batch_size)] for column in self.items)
        game.reset(options={
            "episode": episode,
            "queries": np.asarray(es.task_index)[queries],
            "budgets": self.budgets[queries, samples],
        })  # fmt: skip
        roles = game.roles_for_episode(game.episode)
        for i, agent in enumerate(game.possible_agents):
            if isinstance(learners[agent], CommonNoise):
                uniforms = [es.noise(q, s, roles[i]) for q, s in zip(queries, samples, strict=True)]
                learners[agent].use_sampling_noise(np.stack(uniforms))
        play_games(game, learners)  # no end_rollout: nothing is collected or learned
        stats = {a: learners[a].turn_stats(game.observe(a)) for a in game.possible_agents}
        real = len(items)
        for agent in game.possible_agents:
            record(answers, game, agent, stats[agent], model, queries, samples, real)
        if len(stats) != 2 or not all("value" in st for st in stats.values()):
            return []
        values = np.stack([stats[a]["value"] for a in game.possible_agents])
        scores = np.stack([game.scores[a] for a in game.possible_agents])
        return scores[values.argmax(axis=0), np.arange(game.batch_size)][:real].tolist()


def record(
    answers: dict[str, list[Any]],
    game: Any,
    agent: str,
    stats: dict[str, np.ndarray],
    model: str,
    queries: np.ndarray,
    samples: np.ndarray,
    real: int,
) -> None:
    """Append the first ``real`` rows of a finished batch, from ``agent``'s seat."""
    obs = game.observe(agent)
    i = game.possible_agents.index(agent)
    lengths = np.asarray(obs["num_generated"])
    last = np.asarray(obs["input_ids"])[:, -1]
    hit = metrics.hit_budget(lengths, game.budgets, last, game.tokenizers[i].eos_token_id)
    role = game.roles[agent]
    kl, entropy = stats.get("kl"), stats.get("entropy")
    for b in range(real):
        answers["model"].append(model)
        answers["agent"].append(agent)
        answers["role"].append(role)
        answers["query"].append(int(queries[b]))
        answers["sample"].append(int(samples[b]))
        answers["budget"].append(int(game.budgets[b]))
        answers["reward"].append(float(game.scores[agent][b]))
        answers["kl"].append(None if kl is None else float(kl[b]))
        answers["entropy"].append(None if entropy is None else float(entropy[b]))
        answers["length"].append(int(lengths[b]))
        answers["hit_budget"].append(bool(hit[b]))
        answers["text"].append(game.responses[agent][b])


def build_result(
    evaluator: Evaluator,
    config: Any,
    answers: dict[str, list[Any]],
    *,
    run_dir: Path | None = None,
    updates: int | None = None,
    base: dict[str, list[Any]] | None = None,
    samples: dict[str, list[dict[str, Any]]] | None = None,
    moe: dict[str, float] | None = None,
    common: bool = True,
    etas: tuple[float, ...] = metrics.ETAS,
    reference_is: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``eval.json``: the set, every answer, and the summaries computed from them.
    ``reference_is``: what the ``reference`` rows of each seat are (:func:`reference_kinds`)."""
    rows, summary = report.summarise(answers, etas, evaluator.checked, base)
    return {
        "format": FORMAT,
        "run": str(run_dir) if run_dir is not None else None,
        "updates": updates,
        "task": config.task,
        "algorithm": config.algorithm,
        "model": config.model,
        **evaluator.describe(),
        "common_random_numbers": common,
        **({"reference_is": reference_is} if reference_is else {}),
        "etas": list(etas),
        "rows": rows,
        "summary": summary,
        "samples": samples or {},
        **({"score_moe": moe} if moe else {}),
        "answers": answers,
    }


# ----------------------------------------------------------------------------- evaluation
def evaluate(
    config: Any,
    run_dir: Path | None = None,
    *,
    samples: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    max_queries: int | None = None,
    show: int = 3,
    reference: bool = True,
    task_settings: dict[str, Any] | None = None,
    device: str | None = None,
    etas: tuple[float, ...] = metrics.ETAS,
) -> dict[str, Any]:
    """Evaluate the base model (``reference``) and, with ``run_dir``, the run's agents, on
    the fixed set of the task's held-out queries, each answered ``samples`` times.

    ``samples``, ``batch_size``, ``seed`` and ``max_queries`` default to the config's
    ``eval_*`` settings, so a run's final evaluation plays the set its evaluations along
    training played."""
    from train.checkpoint import find_checkpoint, load_learners
    from train.run import build_game_and_learners

    if run_dir is None and not reference:
        raise ValueError("nothing to evaluate: no run and no reference")
    given = {"eval_samples": samples, "eval_batch_size": batch_size, "eval_seed": seed,
             "eval_queries": max_queries, "device": device}  # fmt: skip
    config = dataclasses.replace(config, **{k: v for k, v in given.items() if v is not None})
    config.validate()  # the evaluation's settings too, before any model loads
    if run_dir is not None:
        find_checkpoint(run_dir)  # a run without a checkpoint fails before models load
    game, learners = build_game_and_learners(config)
    evaluator = Evaluator(
        config, game.tokenizers, samples=config.eval_samples,
        batch_size=config.eval_batch_size, seed=config.eval_seed,
        max_queries=config.eval_queries, task_settings=task_settings,
    )  # fmt: skip
    if not evaluator.held_out:
        warnings.warn(f"evaluating on training queries: {evaluator.note}", stacklevel=2)
    todo = ([report.REFERENCE] if reference else []) + ([report.TRAINED] if run_dir else [])
    tables, shown, moe, common = [], {}, {}, True
    print(evaluator.size_line(len(todo)), file=sys.stderr, flush=True)
    with progress_bar(len(todo) * evaluator.n_batches) as bar:
        for model in todo:
            if model == report.TRAINED:
                load_learners(run_dir, learners)
            answers, shown[model], scores, same = evaluator.play(learners, model, show, bar)
            tables.append(answers)
            common = common and same
            if config.algorithm == "moe" and scores:
                moe[model] = float(np.mean(scores))
    return build_result(
        evaluator, config, report.concat(*tables), run_dir=run_dir, samples=shown, moe=moe,
        common=common, etas=etas, updates=_checkpoint_updates(run_dir),
        reference_is=reference_kinds(learners) if reference else None,
    )  # fmt: skip


def progress_bar(batches: int, desc: str = "evaluating") -> Any:
    """The evaluation's bar: batches done, their rate and the time left (tqdm's estimate
    from the batches so far)."""
    return tqdm(total=batches, desc=desc, unit="batch", dynamic_ncols=True)


def reference_kinds(learners: dict[str, Any]) -> dict[str, str]:
    """What the ``reference`` rows of each seat are: an LLM learner's untrained policy is
    its base model; a learner with no base model (not an LLM) is a freshly built copy."""
    return {agent: BASE_MODEL if isinstance(learner, Exportable) else UNTRAINED
            for agent, learner in learners.items()}  # fmt: skip


def _checkpoint_updates(run_dir: Path | None) -> int | None:
    """How many updates the run's checkpoint holds (None without a run)."""
    if run_dir is None:
        return None
    from train.checkpoint import checkpoint_updates

    return checkpoint_updates(run_dir)


def _answer_checked(game: Any) -> bool:
    from cory_env.rewards import AnswerCheckReward

    return isinstance(game.task.reward_fn, AnswerCheckReward)


# ----------------------------------------------------------------------------- output
def write_eval(folder: Path, result: dict[str, Any], stem: str = "eval") -> tuple[Path, Path]:
    """``{stem}.json`` and ``{stem}.md`` in ``folder``, each written beside and then moved
    into place, so an interrupted write never leaves a partial file; an earlier
    evaluation of the same name is kept, renamed with its time."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
    if stem == "eval" and json_path.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(json_path.stat().st_mtime))
        for path in (json_path, md_path):
            if path.exists():
                path.rename(path.with_name(f"{stem}-{stamp}{path.suffix}"))
    write_text(json_path, json.dumps(result) + "\n")
    write_text(md_path, report.to_markdown(result))
    return json_path, md_path


def evaluate_run(run_dir: Path, **options: Any) -> dict[str, Any]:
    """Evaluate one run folder and write its ``eval.json`` and ``eval.md``."""
    result = evaluate(load_run_config(run_dir), Path(run_dir), **options)
    write_eval(run_dir, result)
    return result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from agents.state_io import CheckpointError
    from cory_env.checks import SettingError
    from train.algorithms import ALGORITHMS
    from train.config import _flag_value, build_config

    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders to evaluate")
    parser.add_argument("--run", type=Path, action="append", default=[], help="same as RUN_DIR")
    parser.add_argument("--algorithm", default="cory", choices=sorted(ALGORITHMS),
                        help="without a run: the game the base model plays")  # fmt: skip
    parser.add_argument("--task", help="without a run: the task (default imdb)")
    parser.add_argument("--model", help="without a run: the model (default embedded)")
    parser.add_argument("--preset", help="without a run: a training preset to start from")
    parser.add_argument("--max_new_tokens", type=_flag_value)
    parser.add_argument(
        "--task_settings", type=_flag_value, default=None,
        help="override the held-out task settings, e.g. '{split: train}'",
    )  # fmt: skip
    parser.add_argument("--samples", type=int, help="answers per query (default: the run's "
                        "eval_samples, 4)")  # fmt: skip
    parser.add_argument("--max_queries", type=int, help="the first N distinct queries only")
    parser.add_argument("--batch_size", type=int, help="games per batch (default 32)")
    parser.add_argument("--seed", type=int, help="fixes budgets and uniforms (default 1234)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--show", type=int, default=3, help="sample exchanges kept per role")
    parser.add_argument("--no_reference", action="store_true", help="skip the base-model rows")
    parser.add_argument("--out", type=Path, help="without a run: folder for eval.json/eval.md")
    parser.add_argument(
        "--seats", type=_flag_value, metavar="MAPPING",
        help="play a game of agents from any runs: {llm_0: RUN:AGENT, llm_1: base} (a player "
        "is RUN:AGENT, base, or a model folder); writes to --out",
    )  # fmt: skip
    parser.add_argument(
        "--cross_play", nargs="+", metavar="PLAYER",
        help="every agent of these runs (or each RUN:AGENT, model folder) and the base model as "
        "pioneer against every one as observer; writes cross_play.csv and .png to --out",
    )  # fmt: skip
    args = parser.parse_args(argv)
    runs = [*args.runs, *args.run]
    if args.seats is not None or args.cross_play:
        if runs or (args.seats is not None and args.cross_play):
            parser.error("--seats, --cross_play and run folders are three separate uses; give one")
        if args.out is None:
            parser.error("--seats and --cross_play write into --out DIR; give one")
        try:
            return [_play_players(args)]
        except (SettingError, FileNotFoundError, CheckpointError, ValueError) as err:
            parser.error(str(err))
    options = {
        "samples": args.samples, "batch_size": args.batch_size, "seed": args.seed,
        "max_queries": args.max_queries, "show": args.show,
        "reference": not args.no_reference, "task_settings": args.task_settings,
        "device": args.device,
    }  # fmt: skip
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
    except (SettingError, FileNotFoundError, CheckpointError, ValueError) as err:
        parser.error(str(err))
    for result in results:
        print(report.to_markdown(result))
        for s in result["samples"].get("trained", result["samples"].get("reference", []))[:3]:
            print(json.dumps(s, ensure_ascii=False))
        if result["run"]:
            print(f"wrote {Path(result['run']) / 'eval.json'} and eval.md\n")
    return results


def _play_players(args: Any) -> dict[str, Any]:
    """``--seats`` (one game, written as eval.json) or ``--cross_play`` (the matrix)."""
    from cory_env.checks import SettingError
    from train import cross_play as xp

    options = {"samples": args.samples, "batch_size": args.batch_size, "seed": args.seed,
               "max_queries": args.max_queries}  # fmt: skip
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
