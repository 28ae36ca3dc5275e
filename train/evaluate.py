"""Evaluate trained agents and their base model on held-out queries, every agent in every role.

python train/evaluate.py RUN_DIR [RUN_DIR ...]      # writes RUN_DIR/eval.json and eval.md
python train/evaluate.py --task arith --k 4         # the base model alone (--out DIR to keep it)

Held-out queries: the task's test split (IMDB with a dataset, GSM8K from the hub), the
packaged IMDB openings' held-out fifth, or arith drawn with another generator seed (minus
any problem training could draw). Each agent answers in every role on the same queries,
and the untrained base model plays the same games in every seat as the ``reference``
rows, so every number has its baseline. Metrics are defined in ``train/metrics.py``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from train import metrics

HELD_OUT_SEED_OFFSET = 1
"""Arith evaluation draws its problems with the training ``seed`` plus this."""
_LOCAL_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".parquet")


# ----------------------------------------------------------------------------- held-out
def held_out_settings(task: str, settings: dict[str, Any]) -> tuple[dict[str, Any], str, bool]:
    """The task settings that select queries training never draws, a note, and whether
    they are truly held out (a single local file or the GSM8K fixture has no test split)."""
    out = dict(settings)
    dataset = settings.get("dataset")
    local = dataset is not None and Path(str(dataset)).suffix.lower() in _LOCAL_SUFFIXES
    if task == "arith":
        out["seed"] = int(settings.get("seed", 0)) + HELD_OUT_SEED_OFFSET
        return out, f"arith problems of generator seed {out['seed']}, minus training's", True
    if task not in ("imdb", "gsm8k"):
        return out, f"task {task!r} has no known test split: training queries", False
    if local or (task == "gsm8k" and dataset is None):
        what = f"the local file {dataset}" if local else "the packaged GSM8K fixture"
        return out, f"{what} has one split: training queries, not held out", False
    if task == "imdb" and dataset is None and settings.get("split", "train") == "all":
        return out, "training drew from every packaged opening: nothing is held out", False
    out["split"] = "test"
    where = "the packaged openings" if dataset is None else f"dataset {dataset}"
    return out, f"split 'test' of {where}", True


def drop_training_queries(game: Any, config: Any) -> int:
    """Arith: remove evaluation problems that the training generator also drew."""
    from cory_env.tasks import make_task

    seen = {q.text for q in make_task(config.task, **config.task_settings).queries}
    kept = [q for q in game.task.queries if q.text not in seen]
    if not kept:
        raise ValueError("every held-out arith problem also occurs in training; raise n_queries")
    dropped = len(game.task.queries) - len(kept)
    game.task.queries = kept
    return dropped


def eval_config(
    config: Any, batch_size: int, group_size: int, task_settings: dict[str, Any], device: str | None
) -> Any:
    """The run's config set up to evaluate: the eval batch, groups of k, exact KL."""
    config = copy.deepcopy(config)
    config.task_settings = task_settings
    config.batch_size, config.group_size = batch_size, group_size
    # Evaluation never learns: mini-batches only have to divide the batch. The exact KL
    # is recorded whatever estimator training used.
    config.ppo = dataclasses.replace(
        config.ppo, mini_batch_size=batch_size, gradient_accumulation_steps=1, kl_estimator="full"
    )
    if device is not None:
        config.device = device
    config.validate()
    return config


# ----------------------------------------------------------------------------- playing
@dataclass
class Answers:
    """Everything one (model, agent, role) cell of the table is computed from."""

    scores: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    hit_budget: list[bool] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    correct: list[np.ndarray] = field(default_factory=list)
    """Per query group: which of its k answers were correct (answer-checked tasks)."""

    def extend(self, other: Answers) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))


def record(game: Any, agent: str, stats: dict[str, np.ndarray], checked: bool) -> Answers:
    """One finished batch from ``agent``'s seat."""
    obs = game.observe(agent)
    i = game.possible_agents.index(agent)
    lengths = np.asarray(obs["num_generated"])
    last = np.asarray(obs["input_ids"])[:, -1]
    scores = np.asarray(game.scores[agent], dtype=float)
    k = game.group_size
    return Answers(
        scores=scores.tolist(),
        kls=np.asarray(stats.get("kl", []), dtype=float).tolist(),
        entropies=np.asarray(stats.get("entropy", []), dtype=float).tolist(),
        lengths=lengths.tolist(),
        hit_budget=metrics.hit_budget(
            lengths, game.budget, last, game.tokenizers[i].eos_token_id
        ).tolist(),
        texts=list(game.responses[agent]),
        correct=list((scores >= 1.0).reshape(-1, k)) if checked else [],
    )


def play_every_role(
    game: Any, learners: dict[str, Any], batches: int, seed: int, show: int
) -> tuple[dict[tuple[str, str], Answers], list[dict[str, Any]], list[float]]:
    """Play ``batches`` batches per role rotation; the same queries and budgets in each.

    Rotation ``s`` is episode ``s * role_exchange_period`` of the game, in which the
    pioneer seat has moved ``s`` places, so every agent plays every role.
    """
    from cory_env.rewards import AnswerCheckReward
    from train.loop import batch_samples, play_games

    checked = isinstance(game.task.reward_fn, AnswerCheckReward)
    cells: dict[tuple[str, str], Answers] = {}
    samples: list[dict[str, Any]] = []
    moe: list[float] = []
    period = game.settings.role_exchange_period
    for shift in range(game.n_agents):
        for b in range(batches):
            game.reset(seed=seed + b, options={"episode": shift * period})
            play_games(game, learners)  # no end_rollout: nothing is collected or learned
            stats = {a: learners[a].turn_stats(game.observe(a)) for a in game.possible_agents}
            for agent, role in game.roles.items():
                answers = record(game, agent, stats[agent], checked)
                cells.setdefault((agent, role), Answers()).extend(answers)
            if all("value" in s for s in stats.values()) and len(stats) == 2:
                values = np.stack([stats[a]["value"] for a in game.possible_agents])
                scores = np.stack([game.scores[a] for a in game.possible_agents])
                moe.extend(scores[values.argmax(axis=0), np.arange(game.batch_size)].tolist())
            if b == 0:
                samples.extend(batch_samples(game, show))
    return cells, samples, moe


# ----------------------------------------------------------------------------- metrics
def cell_metrics(answers: Answers, etas: tuple[float, ...], checked: bool) -> dict[str, Any]:
    """The reported numbers of one cell (``train/metrics.py`` defines each)."""
    has_kl = len(answers.kls) == len(answers.scores)
    row: dict[str, Any] = {
        "reward": metrics.summary(answers.scores),
        "kl": metrics.summary(answers.kls) if has_kl else None,
        "objective": metrics.objectives(answers.scores, answers.kls, etas) if has_kl else None,
        "pass@k": None,
        "distinct_1": metrics.distinct_n(answers.texts, 1),
        "distinct_2": metrics.distinct_n(answers.texts, 2),
        "repetitive": metrics.repetition_share(answers.texts),
        "hit_budget": float(np.mean(answers.hit_budget)),
        "length": float(np.mean(answers.lengths)),
        "entropy": float(np.mean(answers.entropies)) if answers.entropies else None,
    }
    if checked:
        correct = np.stack(answers.correct)
        row["pass@k"] = {
            str(k): metrics.mean_pass_at_k(correct, k) for k in metrics.pass_ks(correct.shape[1])
        }
    return row


def table_rows(
    model: str, cells: dict[tuple[str, str], Answers], etas: tuple[float, ...], checked: bool
) -> list[dict[str, Any]]:
    """One row per agent and role. The reference is not pooled over seats: every row holds
    the same number of answers, since distinct-n falls as answers are added."""
    order = sorted(cells, key=lambda cell: (cell[0], _role_key(cell[1])))
    return [
        {
            "model": model,
            "agent": agent,
            "role": role,
            **cell_metrics(cells[agent, role], etas, checked),
        }
        for agent, role in order
    ]


def _role_key(role: str) -> tuple[int, str]:
    return (0 if role == "pioneer" else 1, role)


def pooled(cells: dict[tuple[str, str], Answers]) -> dict[str, dict[str, float]]:
    """Mean reward and KL over all agents, per role and over all roles (``all``)."""
    by: dict[str, Answers] = {"all": Answers()}
    for (_, role), answers in cells.items():
        by["all"].extend(answers)
        by.setdefault(role, Answers()).extend(answers)
    out = {}
    for role, a in by.items():
        out[role] = {"reward": float(np.mean(a.scores)), "n": len(a.scores)}
        if len(a.kls) == len(a.scores):
            out[role]["kl"] = float(np.mean(a.kls))
    return out


# ----------------------------------------------------------------------------- evaluation
def evaluate(
    config: Any,
    run_dir: Path | None = None,
    *,
    batches: int = 2,
    batch_size: int = 32,
    k: int | None = None,
    seed: int = 1234,
    show: int = 3,
    reference: bool = True,
    task_settings: dict[str, Any] | None = None,
    device: str | None = None,
    etas: tuple[float, ...] = metrics.ETAS,
) -> dict[str, Any]:
    """Evaluate the base model (``reference``) and, with ``run_dir``, the run's agents.

    ``k`` answers per query (default: 4 for answer-checked tasks, else the run's
    ``group_size``); ``task_settings`` override the held-out ones.
    """
    from train.checkpoint import find_checkpoint
    from train.run import build_game_and_learners

    if run_dir is None and not reference:
        raise ValueError("nothing to evaluate: no run and no reference")
    settings, note, held_out = held_out_settings(config.task, config.task_settings)
    settings.update(task_settings or {})
    checked = config.task in ("gsm8k", "arith")
    group = k if k is not None else (4 if checked else config.group_size)
    if batch_size % group:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of k ({group})")
    cfg = eval_config(config, batch_size, group, settings, device)
    if run_dir is not None:
        find_checkpoint(run_dir)  # a run without a checkpoint fails before models load
    game, learners = build_game_and_learners(cfg)
    if config.task == "arith" and held_out:
        dropped = drop_training_queries(game, config)
        note += f" ({dropped} of them dropped)"
    if not held_out:
        warnings.warn(f"evaluating on training queries: {note}", stacklevel=2)
    checked = checked or _answer_checked(game)
    result: dict[str, Any] = {
        "run": str(run_dir) if run_dir is not None else None,
        "task": config.task,
        "algorithm": config.algorithm,
        "model": config.model,
        "held_out": {"held_out": held_out, "note": note, "task_settings": settings},
        "seed": seed,
        "batches_per_role": batches,
        "batch_size": batch_size,
        "group_size": group,
        "games_per_role": batches * batch_size,
        "etas": list(etas),
        "answer_checked": checked,
        "rows": [],
        "summary": {},
        "samples": {},
    }
    todo = (["reference"] if reference else []) + (["trained"] if run_dir is not None else [])
    for model in todo:
        if model == "trained":
            folder = find_checkpoint(run_dir)
            for agent, learner in learners.items():
                learner.load(folder / agent)
        cells, samples, moe = play_every_role(game, learners, batches, seed, show)
        result["rows"] += table_rows(model, cells, etas, checked)
        result["summary"][model] = pooled(cells)
        result["samples"][model] = samples
        if config.algorithm == "moe" and moe:
            result.setdefault("score_moe", {})[model] = float(np.mean(moe))
    return result


def _answer_checked(game: Any) -> bool:
    from cory_env.rewards import AnswerCheckReward

    return isinstance(game.task.reward_fn, AnswerCheckReward)


# ----------------------------------------------------------------------------- output
def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def to_markdown(result: dict[str, Any]) -> str:
    """Two tables: reward, KL and the objectives; then pass@k and collapse indicators."""
    etas = result["etas"]
    ks = sorted({int(k) for r in result["rows"] for k in (r["pass@k"] or {})})
    head = (
        f"Evaluation of {result['run'] or 'the base model'}: task {result['task']}, "
        f"{result['held_out']['note']}; {result['games_per_role']} games per role "
        f"({result['group_size']} answer(s) per query), seed {result['seed']}."
    )
    lines = [head, ""]
    cols = ["model", "agent", "role", "n", "reward", "95% CI", "KL"]
    cols += [f"r - {eta:g} KL" for eta in etas]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        rw, kl, obj = r["reward"], r["kl"], r["objective"] or {}
        cells = [r["model"], r["agent"], r["role"], str(rw["n"]),
                 f"{rw['mean']:.3f} ± {rw['std']:.3f}",
                 f"[{rw['ci95'][0]:.3f}, {rw['ci95'][1]:.3f}]",
                 "" if kl is None else f"{kl['mean']:.3f} ± {kl['std']:.3f}"]  # fmt: skip
        cells += [_num(obj.get(f"{eta:g}")) for eta in etas]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    cols = ["model", "agent", "role", *(f"pass@{k}" for k in ks)]
    cols += ["distinct-1", "distinct-2", "repetitive", "hit budget", "length", "entropy"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        passes = r["pass@k"] or {}
        cells = [r["model"], r["agent"], r["role"], *(_num(passes.get(str(k))) for k in ks)]
        cells += [_num(r["distinct_1"]), _num(r["distinct_2"]), _num(r["repetitive"]),
                  _num(r["hit_budget"]), _num(r["length"], 1), _num(r["entropy"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if "score_moe" in result:
        moe = ", ".join(f"{m} {v:.3f}" for m, v in result["score_moe"].items())
        lines += ["", f"MoE (per query the answer of higher value): reward {moe}."]
    return "\n".join(lines) + "\n"


def write_eval(folder: Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """``eval.json`` and ``eval.md`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "eval.json", folder / "eval.md"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    md_path.write_text(to_markdown(result))
    return json_path, md_path


def load_run_config(run_dir: Path, overrides: dict[str, Any] | None = None) -> Any:
    """A run's saved config (its own algorithm), with ``overrides``."""
    from train.config import build_config, load_config_file

    config_file = Path(run_dir) / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run folder (it has no config.yaml)")
    algorithm = load_config_file(config_file).get("algorithm", "cory")
    return build_config(config_file=config_file, overrides=overrides, algorithm=algorithm)


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

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=2, help="batches per role rotation")
    parser.add_argument("--k", type=int, help="answers per query (default 4 for gsm8k/arith)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--show", type=int, default=3, help="sample exchanges kept per role")
    parser.add_argument("--no_reference", action="store_true", help="skip the base-model rows")
    parser.add_argument("--out", type=Path, help="without a run: folder for eval.json/eval.md")
    args = parser.parse_args(argv)
    runs = [*args.runs, *args.run]
    options = {
        "batches": args.batches, "batch_size": args.batch_size, "k": args.k, "seed": args.seed,
        "show": args.show, "reference": not args.no_reference,
        "task_settings": args.task_settings, "device": args.device,
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
        print(to_markdown(result))
        for s in result["samples"].get("trained", result["samples"].get("reference", []))[:3]:
            print(json.dumps(s, ensure_ascii=False))
        if result["run"]:
            print(f"wrote {Path(result['run']) / 'eval.json'} and eval.md\n")
    return results


if __name__ == "__main__":
    main()
