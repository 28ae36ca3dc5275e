"""Held-out evaluations along a run (``--eval_every N``): a (KL, reward) trajectory.

Before the first update the agents are the base model: that evaluation is the run's
``reference`` (``RUN/evals/updates_000000.json``), and every later one, after every N
updates and at the end (``updates_<n>.json``), is paired with it answer by answer. Each
evaluation is also one row of ``metrics.jsonl`` (keys ``eval/<role or all>/<number>``,
marked by ``eval/updates``) and goes to TensorBoard at step = updates.

An evaluation runs after the iteration's update and before its checkpoint, so a resumed
run has every evaluation up to its checkpoint and redoes the later ones. It draws from
no random stream of the run (``cory_rl.train.evaluation.evaluator.Evaluator``): a run
trains the same with and without evaluations.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

from cory_rl.train.core.run_folder import EVAL_KEY, EVALS_DIR, eval_stem
from cory_rl.train.evaluation import report
from cory_rl.train.evaluation.evaluator import Evaluator, build_result, write_eval

ROW_NUMBERS = (
    "reward",
    "kl",
    "distinct_2",
    "distinct_2_pooled",
    "repetitive",
    "repetitive_words",
    "entropy",
    "observer_given_right",
    "observer_given_wrong",
)
"""The numbers of each role (and ``all``) that go into ``metrics.jsonl``."""


class TrainingEvaluations:
    """The evaluations of one run, made by the loop through :meth:`begin` and :meth:`after`."""

    def __init__(self, config: Any, tokenizers: Any, run_path: Path) -> None:
        self.config = config
        self.folder = Path(run_path) / EVALS_DIR
        self.run_path = Path(run_path)
        self.evaluator = Evaluator(
            config,
            tokenizers,
            samples=config.eval_samples,
            batch_size=config.eval_batch_size,
            seed=config.eval_seed,
            max_queries=config.eval_queries,
        )
        self.base: dict[str, list[Any]] | None = None
        self.writes = True
        """False on the other processes of a sharded run: they play, the main one writes."""

    def due(self, iteration: int) -> bool:
        """Whether the update of ``iteration`` (0-based) is followed by an evaluation."""
        last = iteration == self.config.iterations - 1
        return last or (iteration + 1) % self.config.eval_every == 0

    def begin(self, learners: dict[str, Any], start: int) -> dict[str, Any] | None:
        """The base model's evaluation: made now (a new run) or read back (a resumed one)."""
        path = self.folder / f"{eval_stem(0)}.json"
        if path.exists():
            self.base = json.loads(path.read_text())["answers"]
            return None
        if start > 0:
            warnings.warn(
                f"{path} is missing: later evaluations of this resumed run have no base "
                "model to be paired with",
                stacklevel=2,
            )
            return None
        return self.evaluate(learners, 0)

    def after(self, iteration: int, learners: dict[str, Any]) -> dict[str, Any]:
        return self.evaluate(learners, iteration + 1)

    def evaluate(self, learners: dict[str, Any], updates: int) -> dict[str, Any]:
        """Play the set, write ``evals/updates_<n>.json`` and ``.md``; the metrics row."""
        t0 = time.perf_counter()
        model = report.REFERENCE if updates == 0 else report.TRAINED
        answers, shown, moe, common = self.evaluator.play(learners, model, self.config.n_samples)
        result = build_result(
            self.evaluator,
            self.config,
            answers,
            run_dir=self.run_path,
            updates=updates,
            base=self.base,
            samples={model: shown},
            common=common,
            moe={model: sum(moe) / len(moe)} if moe and self.config.picks_by_value else None,
        )
        if self.writes:
            write_eval(self.folder, result, eval_stem(updates))
        if updates == 0:
            self.base = answers
        row = metrics_row(result, model, updates)
        row["time/eval_s"] = time.perf_counter() - t0
        return row


def metrics_row(result: dict[str, Any], model: str, updates: int) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of one evaluation along a run (``eval/<point>/<number>``)."""
    row: dict[str, Any] = {"iteration": updates - 1, EVAL_KEY: updates}
    for point, numbers in result["summary"][model].items():
        for name in ROW_NUMBERS:
            if numbers.get(name) is not None:
                row[f"eval/{point}/{name}"] = numbers[name]
        if "reward_minus_base" in numbers:
            row[f"eval/{point}/reward_minus_base"] = numbers["reward_minus_base"]["mean"]
    return row
