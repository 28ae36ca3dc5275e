"""What ``share_prompt_prefix`` saves: the same short training without and with it.

Trains the same run (algorithm, task, model, batch, seed) twice in this process, one right
after the other, without and then with ``share_prompt_prefix`` (``agents/prefix.py``: the
worked examples every prompt opens with run once per forward, not once per row), and
``--repeats 2`` adds the two again in the other order. By default the run is #47's sums
study: CORY on arith in the equation style with 4 worked examples, the observer reading
the pioneer's answer on a ``Reference:`` line, 4 new tokens, the ``cpu`` preset's batch of
32, its 4 epochs of one mini-batch and its ``forward_batch_size`` 16.

Per run it prints the seconds per iteration after the first (a warm-up) and those of
``learn`` (the iteration minus its rollout: the reference pass and the update, the two
places sharing acts), and their ratios, measured in this one run. It also prints the
largest relative difference of the first iteration's update statistics between the two
settings: the same computation up to float rounding.

    python -m bench.bench_prefix [--algorithm cory|ppo] [--iterations 3] [--repeats 1]
        [--batch_size 32] [--shots 4] [--model embedded] [--threads N] [--smoke]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import smoke
from bench.measure import seconds_after_first
from bench.provenance import code_version
from bench.short_run import short_training

SMOKE = {"model": None, "iterations": 2, "batch_size": 4, "shots": 2}
"""``--smoke``: 2 iterations of a batch of 4 on the tiny model."""
COMPARED = ("approx_kl", "clipfrac", "policy_loss", "value_loss", "entropy", "/kl")
"""The update statistics whose first-iteration values the two settings are compared on."""


def run(args: argparse.Namespace, share: bool, folder: Path) -> list[dict[str, Any]]:
    """Train once; the rows of its ``metrics.jsonl``."""
    task = {
        "task": "arith",
        "task_settings": {
            "style": "equation",
            "shots": args.shots,
            "n_queries": 128,
            "observer_prompt": "reference",
        },
        "max_new_tokens": 4,
    }
    return short_training(args, folder, task, {"share_prompt_prefix": share})


def largest_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str]:
    """The largest relative difference between two first iterations' update statistics."""
    worst, name = 0.0, ""
    for key, value in a.items():
        if any(part in key for part in COMPARED) and isinstance(value, (int, float)):
            diff = abs(b[key] - value) / max(abs(value), 1e-4)  # a KL of ~0 at the start
            if diff >= worst:
                worst, name = diff, key
    return worst, name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("cory", "ppo"), default="cory")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--iterations", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--repeats", type=int, default=1, help="2: also with, then without")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return smoke.parse_args(parser, argv, SMOKE)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    order = [False, True, True, False][: 2 * args.repeats]
    timings: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    first: dict[bool, dict[str, Any]] = {}
    with smoke.model_for(args), tempfile.TemporaryDirectory() as scratch:
        for n, share in enumerate(order):
            rows = run(args, share, Path(scratch) / f"run-{n}-{'with' if share else 'without'}")
            timings[share].append(seconds_after_first(rows))
            first.setdefault(share, rows[0])
    without = np.mean(timings[False], axis=0)
    with_sharing = np.mean(timings[True], axis=0)
    worst, name = largest_difference(first[False], first[True])
    print(f"code: {code_version()}")
    print(
        f"{args.algorithm} on arith (equation, {args.shots} worked examples, observer reads a "
        f"reference), batch {args.batch_size}, model {args.model}, "
        f"{torch.get_num_threads()} threads, {args.iterations - 1} measured iteration(s) "
        f"per run, runs in the order {['with' if s else 'without' for s in order]}"
    )
    print(f"without sharing: {without[0]:.2f} s/iteration, learn {without[1]:.2f} s")
    print(f"with sharing:    {with_sharing[0]:.2f} s/iteration, learn {with_sharing[1]:.2f} s")
    print(f"iteration, without / with sharing: {without[0] / with_sharing[0]:.2f}x")
    print(f"learn, without / with sharing: {without[1] / with_sharing[1]:.2f}x")
    print(f"first update's statistics, largest relative difference: {worst:.1e} ({name})")
    return {"iteration": without[0] / with_sharing[0], "learn": without[1] / with_sharing[1]}


if __name__ == "__main__":
    main()
