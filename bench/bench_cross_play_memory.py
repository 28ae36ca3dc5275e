"""Whether cross-play's memory grows with the number of pairs: 21 pairs against 3.

Trains three smoke runs of the repository it is started in (two CORY, one PPO: five
agents), then plays cross-play twice, each time in a fresh process: the PPO agent and the
base model (2 players, 3 pairs), and all five agents and the base model (6 players, 21
pairs). Each pair plays in a process of its own
(``cory_rl.train.evaluation.cross_play``), so the machine's peak is the parent's peak
plus the largest pair's; it prints both for each size and the ratio of the totals,
measured in this one run.

    python -m bench.bench_cross_play_memory [--queries 4] [--json OUT] [--smoke]

``--smoke`` trains one CORY run (one update of 4 games of the tiny model) and plays its
first agent with the base model (3 pairs), then both agents with it (6 pairs), 1 query a pair:
each pair's process costs seconds, whatever the model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import smoke
from bench.provenance import commit

SMOKE = {"queries": 1}
SMOKE_TRAINING = ["--iterations", "1", "--batch_size", "4", "--mini_batch_size", "4"]
"""A smoke run's training flags beside the tiny model's: one update of 4 games."""

PLAY = """
import json, sys
from cory_rl.train.evaluation.cross_play import cross_play, run_players
from cory_rl.train.core.memory import rss_peak_mb
items, queries = json.loads(sys.argv[1]), int(sys.argv[2])
cells = cross_play(run_players(items), {"samples": 1, "max_queries": queries})
pairs = {(c["pioneer"], c["observer"]) for c in cells}
print(json.dumps({"pairs": len({frozenset(p) for p in pairs}), "parent_mb": rss_peak_mb(),
                  "pair_mb": max(c["peak_mb"] for c in cells)}))
"""


def train_smoke(algorithm: str, seed: int, run_dir: Path, flags: list[str]) -> Path:
    command = [
        sys.executable,
        f"train/{algorithm}.py",
        "--preset",
        "smoke",
        "--seed",
        str(seed),
        "--report_to",
        "none",
        "--run_dir",
        str(run_dir),
        *flags,
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run_dir


def players(out: Path, smoke_run: bool, stack: contextlib.ExitStack) -> list[list[str]]:
    """Train the runs; the players of the two plays, the few and the many."""
    if smoke_run:  # the tiny model, for as long as the run and the plays last
        flags = ["--model", stack.enter_context(smoke.tiny_model()), *SMOKE_TRAINING]
        cory = train_smoke("cory", 0, out / "cory-0", flags)
        return [[f"{cory}:llm_0"], [str(cory)]]
    cory = [train_smoke("cory", seed, out / f"cory-{seed}", []) for seed in (0, 1)]
    ppo = train_smoke("ppo", 0, out / "ppo-0", [])
    return [[f"{ppo}:llm_0"], [str(cory[0]), str(cory[1]), f"{ppo}:llm_0"]]


def play(items: list[str], queries: int) -> dict[str, float]:
    command = [sys.executable, "-c", PLAY, json.dumps(items), str(queries)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=4, help="held-out queries per pair")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = smoke.parse_args(parser, argv, SMOKE)
    version = commit()
    with tempfile.TemporaryDirectory() as out, contextlib.ExitStack() as stack:
        few_players, many_players = players(Path(out), args.smoke, stack)
        few, many = play(few_players, args.queries), play(many_players, args.queries)
    print(f"commit {version}: smoke agents, {args.queries} queries x 1 sample a pair")
    print("pairs | parent peak MB | largest pair's peak MB | total MB")
    for row in (few, many):
        total = row["parent_mb"] + row["pair_mb"]
        print(f"{row['pairs']} | {row['parent_mb']:.0f} | {row['pair_mb']:.0f} | {total:.0f}")
    ratio = (many["parent_mb"] + many["pair_mb"]) / (few["parent_mb"] + few["pair_mb"])
    print(f"total peak, {many['pairs']} pairs / {few['pairs']} pairs: {ratio:.2f}x")
    if args.json:
        figures = {"commit": version, "few": few, "many": many, "ratio": ratio}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
