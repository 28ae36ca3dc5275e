"""Play the fixed held-out set with any learners and turn the answers into ``eval.json``.

The set and its common random numbers are ``cory_rl.train.evaluation.eval_set``'s; the summaries
``cory_rl.train.evaluation.report``'s. ``evaluate`` builds a config's game and learners (a run's
trained agents with ``run_dir``) and plays the set; ``train/evaluate.py`` is its command.
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

from cory_env.rewards import AnswerCheckReward
from cory_env.tasks import held_out_split, make_task
from cory_rl.train.config.files import write_text
from cory_rl.train.core.checkpoint import checkpoint_updates, load_learners
from cory_rl.train.core.games import batch_samples, make_game, play_games
from cory_rl.train.core.run_folder import EVAL_FORMAT, load_run_config
from cory_rl.train.core.trained import build_trained
from cory_rl.train.evaluation import measures, report
from cory_rl.train.evaluation.eval_set import EvalSet, padded

BASE_MODEL, UNTRAINED = "the base model", "an untrained copy of the learner (no base model)"
"""What the ``reference`` rows of a seat are (``eval.json["reference_is"]``)."""


def drop_training_queries(game: Any, config: Any) -> int:
    """Remove evaluation queries that training also draws (a task's generated problems)."""
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
    """Plays the fixed evaluation set (``cory_rl.train.evaluation.eval_set``) with any learners.

    Built once per run (the held-out task, its game and the set); :meth:`play` then
    answers the whole set with the given learners, every agent in every role, and returns
    one record per answer (``cory_rl.train.evaluation.report.ANSWER_COLUMNS``). Learners that take
    common random numbers (``cory_rl.agents.base.CommonNoise``) draw each answer's tokens with
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
        split = held_out_split(config.task, config.task_settings)
        self.note, self.held_out = split.note, split.held_out
        settings = {**split.settings, **(task_settings or {})}
        self.task_settings = settings
        game = make_game(config, tokenizers, task_settings=settings, group_size=1, batch_size=1)
        if split.minus_training and self.held_out:
            dropped = drop_training_queries(game, config)
            self.note += f" ({dropped} of them dropped)"
        self.eval_set = EvalSet.build(
            [q.text for q in game.task.queries],
            samples,
            seed,
            (game.budget_low, game.budget_high),
            max_queries,
        )
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
                "held_out": self.held_out,
                "note": self.note,
                "task_settings": self.task_settings,
            },
            "eval_set": self.eval_set.describe(),
            "answer_checked": self.checked,
        }

    def play(
        self, learners: dict[str, Any], model: str, show: int = 3, progress: Any = None
    ) -> tuple[dict[str, list[Any]], list[dict[str, Any]], list[float], bool]:
        """Every answer of ``learners`` to the set, in every role; the first ``show``
        exchanges of each role rotation; the MoE score per game (two value heads); and
        whether every learner drew with the set's common random numbers. ``progress``, a
        tqdm bar, advances by one per batch."""
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
                learner.use_sampling_noise(None)
        common = all(learner.takes_sampling_noise for learner in learners.values())
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
        game, es = self.game, self.eval_set
        queries, samples = (column[padded(items, game.batch_size)] for column in self.items)
        game.reset(
            options={
                "episode": episode,
                "queries": np.asarray(es.task_index)[queries],
                "budgets": self.budgets[queries, samples],
            }
        )
        roles = game.roles_for_episode(game.episode)
        for i, agent in enumerate(game.possible_agents):
            if learners[agent].takes_sampling_noise:
                uniforms = [es.noise(q, s, roles[i]) for q, s in zip(queries, samples, strict=True)]
                if learners[agent].seats > 1:  # one learner, each seat its own noise
                    learners[agent].use_sampling_noise(np.stack(uniforms), role=roles[i])
                else:
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
    hit = measures.hit_budget(lengths, game.budgets, last, game.tokenizers[i].eos_token_id)
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
    etas: tuple[float, ...] = measures.ETAS,
    reference_is: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``eval.json``: the set, every answer, and the summaries computed from them.
    ``reference_is``: what the ``reference`` rows of each seat are (:func:`reference_kinds`)."""
    rows, summary = report.summarise(answers, etas, evaluator.checked, base)
    return {
        "format": EVAL_FORMAT,
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
    etas: tuple[float, ...] = measures.ETAS,
) -> dict[str, Any]:
    """Evaluate the base model (``reference``) and, with ``run_dir``, the run's agents, on
    the fixed set of the task's held-out queries, each answered ``samples`` times.

    ``samples``, ``batch_size``, ``seed`` and ``max_queries`` default to the config's
    ``eval_*`` settings, so a run's final evaluation plays the set its evaluations along
    training played."""
    if run_dir is None and not reference:
        raise ValueError("nothing to evaluate: no run and no reference")
    given = {
        "eval_samples": samples,
        "eval_batch_size": batch_size,
        "eval_seed": seed,
        "eval_queries": max_queries,
        "device": device,
    }
    config = dataclasses.replace(config, **{k: v for k, v in given.items() if v is not None})
    config.validate()  # the evaluation's settings too, before any model loads
    # a run without a checkpoint fails before models load; the base model plays first
    trained = build_trained(config, run_dir, weights=False)
    game, learners = trained.game, trained.learners
    evaluator = Evaluator(
        config,
        game.tokenizers,
        samples=config.eval_samples,
        batch_size=config.eval_batch_size,
        seed=config.eval_seed,
        max_queries=config.eval_queries,
        task_settings=task_settings,
    )
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
            if config.picks_by_value and scores:
                moe[model] = float(np.mean(scores))
    return build_result(
        evaluator,
        config,
        report.concat(*tables),
        run_dir=run_dir,
        samples=shown,
        moe=moe,
        common=common,
        etas=etas,
        updates=_checkpoint_updates(run_dir),
        reference_is=reference_kinds(learners) if reference else None,
    )


def progress_bar(batches: int, desc: str = "evaluating") -> Any:
    """The evaluation's bar: batches done, their rate and the time left (tqdm's estimate
    from the batches so far)."""
    return tqdm(total=batches, desc=desc, unit="batch", dynamic_ncols=True)


def reference_kinds(learners: dict[str, Any]) -> dict[str, str]:
    """What the ``reference`` rows of each seat are: an LLM learner's untrained policy is
    its base model; a learner with no base model (not an LLM) is a freshly built copy."""
    return {
        agent: BASE_MODEL if learner.exportable else UNTRAINED
        for agent, learner in learners.items()
    }


def _checkpoint_updates(run_dir: Path | None) -> int | None:
    """How many updates the run's checkpoint holds (None without a run)."""
    if run_dir is None:
        return None
    return checkpoint_updates(run_dir)


def _answer_checked(game: Any) -> bool:
    return isinstance(game.task.reward_fn, AnswerCheckReward)


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
