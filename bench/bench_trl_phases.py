"""Where one step of ours and of TRL's trainer goes, phase by phase, and the floor both
sides share: the breakdown behind ``bench/bench_trl.py``'s ratios.

``bench_trl.py`` times whole steps and patches nothing. This script answers the next
question, where the seconds go, so it does patch: TRL's phases are timed by wrapping
``model.generate`` (generation), ``_get_per_token_logps_and_entropies`` (each forward of
the policy or the reference, with and without gradients), ``torch.autograd.backward`` and
the optimiser's ``step``; what is left of the step (rewards, advantages, bookkeeping,
logging) is "other". Ours is timed by the phase recorder of ``bench/measure.py`` (as
``bench_train.py`` is), through the learners' probes. Same settings and prompts as
``bench_trl.py`` (its ``our_overrides`` and ``trl_kwargs``; ours runs first and TRL gets its
prompts), each side in its own process, one after the other.

The floor is the arithmetic both sides must do at these settings, at this machine's matmul
peak: sampling the answers token by token (FLOPs counted by ``bench/measure.py``) and one
forward and backward of the policy over prompt + answer. A step at half of TRL's time
needs to be under it wherever TRL's step is less than twice the floor.

Usage::

    python -m bench.bench_trl_phases [--learners grpo rloo] [--new_tokens 64] [--steps 4]

It takes ``bench_trl.py``'s arguments, ``--smoke`` included.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
import trl

from bench import bench_trl, smoke
from bench.measure import LoopTimer, Recorder, instrument, matmul_peak, matmul_shapes, mean_phases
from bench.provenance import code_version
from cory_env import load_causal_lm
from cory_rl.train.config import allocator
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.training.loop import train

PHASES = ("generation", "reference / old forward", "forward", "backward", "optimiser", "other")


def ours_phases(args: Any, learner: str) -> dict[str, Any]:
    """Our learner through the real loop with the bench's recorder: mean phase seconds."""

    class Prompts(LoopTimer):
        """The recorder's loop timer, also keeping each step's prompts for TRL."""

        def __init__(self, rec: Any, game: Any, group_size: int) -> None:
            super().__init__(rec)
            self.game, self.group_size, self.prompts = game, group_size, []

        def phase(self, name: str, iteration: int) -> Any:
            inner = super().phase(name, iteration)
            if name == "learn":
                self.prompts.append([q.text for q in self.game.queries[:: self.group_size]])
            return inner

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / f"ours-{learner}"
        config = build_config(
            overrides=bench_trl.our_overrides(args, learner, str(run_dir)), algorithm=learner
        )
        game, learners = build_game_and_learners(config)
        rec = Recorder(next(iter(learners.values())).device)
        instrument(rec, learners)
        timer = Prompts(rec, game, config.game.group_size)
        train(config, learners, game, run_dir, callbacks=[timer])
        rows, _ = mean_phases(rec)
    seconds = {
        "generation": rows["act"].seconds,
        "reference / old forward": rows["reference"].seconds,
        "forward": rows["forward"].seconds,
        "backward": rows["backward"].seconds,
        "optimiser": rows["optimiser"].seconds,
    }
    step = rows["rollout"].seconds + rows["learn"].seconds
    seconds["other"] = step - sum(seconds.values())
    return {
        "seconds": seconds,
        "step": step,
        "gflop": {
            "generation": rows["act"].flops / 1e9,
            "update": (rows["forward"].flops + rows["backward"].flops) / 1e9,
        },
        "prompts": timer.prompts,
    }


def trl_phases(args: Any, learner: str, prompts: list[list[str]]) -> dict[str, Any]:
    """TRL's trainer on the same prompts with its phases wrapped in timers: mean seconds of
    the steps after the first."""
    trainer_class = getattr(trl, bench_trl.TRL_NAMES[learner])
    per_step: list[dict[str, float]] = []
    current: dict[str, float] = collections.defaultdict(float)

    def timed(owner: Any, name: str, phase: Any) -> None:
        original = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            key = phase() if callable(phase) else phase
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                current[key] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    timed(transformers.GenerationMixin, "generate", "generation")
    timed(
        trainer_class,
        "_get_per_token_logps_and_entropies",
        lambda: "forward" if torch.is_grad_enabled() else "reference / old forward",
    )
    timed(torch.autograd, "backward", "backward")
    timed(torch.optim.AdamW, "step", "optimiser")

    class StepPhases(transformers.TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            current.clear()
            current["start"] = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step = time.perf_counter() - current.pop("start")
            row = {p: current.get(p, 0.0) for p in PHASES[:-1]}
            row["other"] = step - sum(row.values())
            row["step"] = step
            per_step.append(row)

    original_init = trainer_class.__init__

    def init_with_timer(self: Any, *a: Any, **k: Any) -> None:
        k["callbacks"] = [*(k.get("callbacks") or []), StepPhases()]
        original_init(self, *a, **k)

    trainer_class.__init__ = init_with_timer
    bench_trl.run_trl(args, learner, prompts)
    steady = per_step[1:] or per_step
    mean = {k: sum(r[k] for r in steady) / len(steady) for k in steady[0]}
    return {"seconds": {p: mean[p] for p in PHASES}, "step": mean["step"]}


def matmul_peak_gflops(model: str) -> float:
    """This machine's fp32 matmul rate on the model's shapes (the best of bench_train's)."""
    shapes = matmul_shapes(load_causal_lm(model).config.get_text_config())
    return max(matmul_peak(torch.device("cpu"), torch.float32, shapes).values())


def child(side: str, argv: list[str], learner: str, prompts_file: str | None) -> None:
    allocator.relaunch("auto")
    args = bench_trl.parse_args(argv)
    if side == "ours":
        out = ours_phases(args, learner)
    else:
        out = trl_phases(args, learner, json.loads(Path(prompts_file).read_text()))
    out["peak_gflops"] = matmul_peak_gflops(args.model) if side == "ours" else None
    print("RESULT " + json.dumps(out), flush=True)


def run_side(side: str, argv: list[str], learner: str, prompts_file: str | None = None) -> dict:
    command = [
        sys.executable,
        "-m",
        "bench.bench_trl_phases",
        "--side",
        side,
        "--learner_of_side",
        learner,
        "--prompts_of_side",
        prompts_file or "",
        *argv,
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{side} {learner} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--side"]:
        side, learner, prompts_file = argv[1], argv[3], argv[5] or None
        child(side, argv[6:], learner, prompts_file)
        return
    args = bench_trl.parse_args(argv)
    print(
        f"code: {code_version()}; {args.prompts} prompts x "
        f"{args.group_size} answers, {args.new_tokens} new tokens, {args.epochs} pass(es), "
        f"mean of {args.steps - 1} step(s) after the first",
        flush=True,
    )
    with smoke.model_for(args):  # both sides on one model (a smoke run's too)
        for learner in args.learners:
            compare(learner, [*argv, "--model", args.model])


def compare(learner: str, argv: list[str]) -> None:
    """One learner's phases, ours and TRL's, each side in a process of its own; the floor."""
    ours = run_side("ours", argv, learner)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ours["prompts"], f)
    theirs = run_side("trl", argv, learner, f.name)
    Path(f.name).unlink()
    peak = ours["peak_gflops"]
    floor = {k: v / peak for k, v in ours["gflop"].items()}
    print(f"\n{learner}: seconds per step    ours      TRL")
    for p in PHASES:
        print(f"  {p:<26}{ours['seconds'][p]:>7.2f}{theirs['seconds'][p]:>9.2f}")
    print(
        f"  {'step':<26}{ours['step']:>7.2f}{theirs['step']:>9.2f}   "
        f"ours/TRL {ours['step'] / theirs['step']:.2f}x"
    )
    total = sum(floor.values())
    print(
        f"  floor at {peak:.0f} GFLOP/s: generation {ours['gflop']['generation']:.0f} "
        f"GFLOP = {floor['generation']:.2f} s, one forward + backward "
        f"{ours['gflop']['update']:.0f} GFLOP = {floor['update']:.2f} s, total "
        f"{total:.2f} s; half of TRL's step {theirs['step'] / 2:.2f} s = "
        f"{theirs['step'] / 2 / total:.2f}x the floor; ours {ours['step'] / total:.2f}x, "
        f"TRL {theirs['step'] / total:.2f}x the floor",
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
