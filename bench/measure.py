"""The measuring the benches share: a phase recorder, the learners' probe, FLOP counts.

A :class:`Recorder` keeps nested phase timers, one record per iteration, with each phase's
peak memory: resident set (VmHWM, reset at every phase boundary through
``/proc/self/clear_refs``) and, on CUDA, ``torch.cuda.max_memory_allocated`` (reset
likewise). :func:`instrument` gives every learner a :class:`BenchProbe`
(``cory_rl.agents.llm.Probe``), which times acting, the reference pass, the update's
forward and backward passes and the optimiser step and counts the FLOPs and positions of
each; :class:`LoopTimer`, a callback of the loop (``cory_rl.train.core.callbacks``), times
the loop's own phases. Nothing is patched. :func:`mean_phases` and :func:`report` make the
table ``bench/bench_train.py`` prints; :func:`matmul_peak` measures the rate the FLOPs are
held against.

FLOPs are counted analytically (:func:`calibrate` checks them against
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers.pytorch_utils import Conv1D

from cory_rl.agents.llm import LLMLearner, Probe
from cory_rl.train.core.callbacks import Callback
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
    """What the FLOP formulas need of one policy (the module docstring)."""

    base: int  # weights of the body's linear layers (LoRA: frozen)
    lora: int  # one adapter's A and B weights
    head: int  # V * d
    layers: int
    attention: int  # heads * head_dim
    trains_base: bool

    @classmethod
    def of(cls, policy: nn.Module) -> ModelCounts:
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


def seconds_after_first(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(s/iteration, learn s/iteration) of a run's ``metrics.jsonl`` rows, over the iterations
    after the first (a warm-up); learn is the iteration minus its rollout."""
    timed = [r for r in rows if "time/iteration_s" in r][1:]
    iteration = float(np.mean([r["time/iteration_s"] for r in timed]))
    learn = float(np.mean([r["time/iteration_s"] - r["time/rollout_s"] for r in timed]))
    return iteration, learn


def matmul_peak(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]]):
    """Best GFLOP/s of ``torch.matmul`` over a few repeats, per (M, K, N) shape."""
    out = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        best = float("inf")
        for i in range(7):
            sync(device)
            start = time.perf_counter()
            torch.matmul(a, b)
            sync(device)
            if i >= 2:  # the first calls allocate and warm up
                best = min(best, time.perf_counter() - start)
        out[(m, k, n)] = 2.0 * m * k * n / best / 1e9
    return out


def matmul_shapes(config: Any) -> list[tuple[int, int, int]]:
    """The (M, K, N) products of a model's shapes the peak is measured on: its MLP's and its
    LM head's, 2048 rows each (``config``: the model's text config)."""
    hidden = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return [(2048, hidden, inner or 4 * hidden), (2048, hidden, config.vocab_size)]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer reads the work done."""
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
        sync(self.device)
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
            sync(self.device)
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
            phase = (
                rec.phase("forward") if adapter else contextlib.nullcontext(rec.phases["reference"])
            )
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
            raise TypeError(f"{agent}: the bench measures LLM learners, got {type(learner)}")
        counts = ModelCounts.of(learner.model)
        rec.counts = counts
        learner.probe = BenchProbe(rec, agent, counts, captured)
    return captured


class LoopTimer(Callback):
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


def calibrate(captured: dict, counts: ModelCounts) -> list[str]:
    """Analytic vs FlopCounterMode FLOPs of one learn micro-batch, forward and backward."""
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


def peak_rss_path(rises: list[tuple[float, str]], step_mb: float = 100.0) -> str:
    """Where the resident memory climbed (steps of at least ``step_mb``) to its peak."""
    kept: list[tuple[float, str]] = []
    for rss, where in rises:
        if not kept or rss >= kept[-1][0] + step_mb or rss >= 0.98 * rises[-1][0] > kept[-1][0]:
            kept.append((rss, where))
    return "peak RSS climbed: " + ", ".join(f"{rss:.0f} MB in {where}" for rss, where in kept)
