"""Whether a sweep's memory grows run after run: each run's logged peak, in order.

Runs ``train/sweep.py`` of the repository it is started in (so it measures that checkout's
code) on short runs of the ``cpu`` preset, one process for all of them, then prints each
run's ``memory/peak_mb`` at its first and last update in the order the runs trained. A
leak shows as peaks that climb by about one run's optimiser state each time; without one
they stay at the largest run so far (mimalloc keeps freed memory resident for reuse).

    python -m bench.bench_sweep_memory [--algorithms ppo] [--seeds 0 1 2] [--json OUT] [--smoke]

``--smoke`` sweeps two seeds of two updates of 4 games each on the tiny model.
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

FLAGS = [
    "--preset",
    "cpu",
    "--iterations",
    "2",
    "--batch_size",
    "16",
    "--mini_batch_size",
    "8",
    "--checkpoint_every",
    "5",
]
"""Two updates of 16 games: enough for every learner to build its optimiser state."""
SMOKE = {"seeds": ["0", "1"]}
SMOKE_FLAGS = [
    "--preset",
    "smoke",
    "--iterations",
    "2",
    "--batch_size",
    "4",
    "--mini_batch_size",
    "2",
    "--checkpoint_every",
    "5",
]
"""A smoke run's flags beside the tiny model's: two updates of 4 games."""


def run_peaks(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["memory/peak_mb"] for row in rows if "memory/peak_mb" in row]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=["ppo"])
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = smoke.parse_args(parser, argv, SMOKE)
    version = commit()
    with tempfile.TemporaryDirectory() as out, contextlib.ExitStack() as stack:
        flags = FLAGS
        if args.smoke:  # the tiny model, for as long as the sweep lasts
            flags = [*SMOKE_FLAGS, "--model", stack.enter_context(smoke.tiny_model())]
        command = [
            sys.executable,
            "train/sweep.py",
            "--algorithms",
            *args.algorithms,
            "--seeds",
            *args.seeds,
            *flags,
            "--out",
            out,
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        runs = sorted(Path(out).glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
        peaks = {p.parent.name: run_peaks(p.parent) for p in runs}
    print(f"commit {version}: {' '.join(command[1:-2])}")
    print("run (in the order trained) | peak MB at the first update | at the last")
    for name, values in peaks.items():
        print(f"{name} | {values[0]:.0f} | {values[-1]:.0f}")
    if args.json:
        args.json.write_text(
            json.dumps({"commit": version, "flags": flags, "peaks_mb": peaks}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
