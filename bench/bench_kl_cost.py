"""What the exact KL penalty costs against the official form: the same short training twice.

``kl_penalty: full`` (the default) differentiates each state's full-vocabulary KL in the
loss, so the reference's log-probabilities over the whole vocabulary are kept from the
reference pass to the update and the KL is computed again under the current policy at every
mini-batch; ``full_in_reward`` (the official CORY code's form) only puts the KL in the reward
(docs/learners.md, "The KL penalty"). This trains the same run (algorithm, task, model,
batch, seed) once with each, each in a process of its own so that each peak memory is its
own, one right after the other; ``--repeats 2`` adds the two again in the other order.

Per form it prints the seconds per iteration after the first (a warm-up), those of
``learn`` (the iteration minus its rollout: the reference pass and the update, where the
forms differ) and the process's peak memory (``memory/peak_mb``), and the ratios of the
exact form to the official one, measured in this one run. By default the run is the ``cpu``
preset's PPO on the packaged openings scored by VADER (the KL pilot's setting).

    python -m bench.bench_kl_cost [--algorithm ppo|cory] [--iterations 3] [--repeats 1]
        [--batch_size 32] [--model embedded] [--threads N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench import smoke
from bench.measure import seconds_after_first
from bench.provenance import code_version
from bench.short_run import short_training

SMOKE = {"model": None, "iterations": 2, "batch_size": 4}
"""``--smoke``: 2 iterations of a batch of 4 on the tiny model."""
FORMS = ("full_in_reward", "full")
"""The official form (the baseline), then the exact default."""


def train_once(args: argparse.Namespace, form: str, folder: Path) -> None:
    """Train once with ``kl_penalty: form`` into ``folder`` (a child process's work)."""
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    short_training(args, folder, {"task": "imdb"}, {"kl_penalty": form})


def measured(folder: Path) -> tuple[float, float, float]:
    """(s/iteration, learn s/iteration, peak MB) of a finished run, after its first iteration
    for the times and over the whole run for the memory."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    iteration, learn = seconds_after_first(rows)
    peak = max(float(r["memory/peak_mb"]) for r in rows if "memory/peak_mb" in r)
    return iteration, learn, peak


def _child_argv(argv: list[str], form: str, folder: Path) -> list[str]:
    return [sys.executable, "-m", "bench.bench_kl_cost", *argv, "--child", form, str(folder)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("ppo", "cory"), default="ppo")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--iterations", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--repeats", type=int, default=1, help="2: also in the other order")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--child", nargs=2, metavar=("FORM", "FOLDER"), default=None, help=argparse.SUPPRESS
    )
    return smoke.parse_args(parser, argv, SMOKE)


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child is not None:
        train_once(args, args.child[0], Path(args.child[1]))
        return {}
    order = [*FORMS, *reversed(FORMS)][: 2 * args.repeats]
    results: dict[str, list[tuple[float, float, float]]] = {form: [] for form in FORMS}
    with smoke.model_for(args), tempfile.TemporaryDirectory() as scratch:
        # a smoke run's tiny model is written once, here, and named to each child
        child_args = [*argv, "--model", args.model]
        for n, form in enumerate(order):
            folder = Path(scratch) / f"run-{n}-{form}"
            done = subprocess.run(
                _child_argv(child_args, form, folder), capture_output=True, text=True
            )
            if done.returncode:
                raise SystemExit(
                    f"bench_kl_cost: the {form} run failed ({done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            print(f"{form} run {n + 1} of {len(order)} done", flush=True)
            results[form].append(measured(folder))
    mean: dict[str, Any] = {form: np.mean(results[form], axis=0) for form in FORMS}
    official, exact = mean["full_in_reward"], mean["full"]
    print(f"code: {code_version()}")
    print(
        f"{args.algorithm} on imdb (openings, VADER), cpu preset, batch {args.batch_size}, "
        f"model {args.model}, {args.iterations - 1} measured iteration(s) per run, runs in "
        f"the order {order}, each in its own process"
    )
    for form in FORMS:
        iteration, learn, peak = mean[form]
        print(f"{form:>14}: {iteration:.2f} s/iteration, learn {learn:.2f} s, peak {peak:.0f} MB")
    ratios = {
        "iteration": exact[0] / official[0],
        "learn": exact[1] / official[1],
        "peak": exact[2] / official[2],
    }
    print(f"iteration, full / full_in_reward: {ratios['iteration']:.2f}x")
    print(f"learn, full / full_in_reward: {ratios['learn']:.2f}x")
    print(f"peak memory, full / full_in_reward: {ratios['peak']:.2f}x")
    return ratios


if __name__ == "__main__":
    main()
