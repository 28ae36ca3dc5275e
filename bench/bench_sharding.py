"""What FSDP2 costs and saves against data-parallel (DDP), per process, at the same run.

Runs the same short training twice under ``accelerate launch``, one after the other, with
the same processes, model, batch and seeds: once sharded (``train/configs/fsdp2.yaml``:
every seat's policy, value head and the frozen reference sharded, ``agents/sharding.py``)
and once data-parallel (``multi_cpu.yaml`` or ``multi_gpu.yaml``: a whole copy of
everything on every process). Each process records:

- its peak memory (resident set, VmHWM; on CUDA also ``max_memory_allocated``);
- the seconds per iteration after the first (a warm-up);
- per seat, the bytes its collectives moved (FSDP2: weights all-gathered, gradients
  reduce-scattered; DDP: gradients all-reduced) and the seconds spent inside them, which
  include waiting for the slower process. Counted by wrapping ``torch.distributed``'s
  collectives (FSDP2) and a DDP communication hook around DDP's own all-reduce; a
  collective outside a seat's work (the loop's means, checkpoints) counts as ``other``.

It prints both runs per process and their ratios, measured in this one run.

    python -m bench.bench_sharding [--algorithm cory] [--lora] [--processes 2]
        [--iterations 3] [--batch_size 8] [--model embedded] [--device cpu|cuda] [--out FILE]
        [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bench import smoke
from bench.provenance import ROOT, commit
from cory_rl.agents.sharding import is_sharded
from cory_rl.train.config import allocator
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners, make_accelerator
from cory_rl.train.core.callbacks import Callback
from cory_rl.train.core.distributed import Processes
from cory_rl.train.core.memory import reset_rss_peak, rss_peak_mb
from cory_rl.train.training.loop import train

SMOKE = {"model": None, "iterations": 2, "batch_size": 2}
"""``--smoke``: both launches of 2 processes, 2 iterations (the first a warm-up) of the tiny
model."""
SEAT = contextvars.ContextVar("seat", default="other")
"""The seat whose work runs now (set by each learner's probe)."""
TRAFFIC: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
"""seat -> {"<op> bytes": ..., "<op> s": ...}"""
IN_HOOK = contextvars.ContextVar("in_hook", default=False)
"""Inside DDP's hook, which counts its all-reduce itself (it calls ``dist.all_reduce``)."""


def record(op: str, nbytes: float, seconds: float) -> None:
    seat = TRAFFIC[SEAT.get()]
    seat[f"{op} bytes"] += nbytes
    seat[f"{op} s"] += seconds


class TimedWork:
    """An asynchronous collective's handle whose ``wait`` adds to its time."""

    def __init__(self, work: Any, op: str, seat: str) -> None:
        self._work, self._op, self._seat = work, op, seat

    def wait(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._work.wait(*args)
        finally:
            TRAFFIC[self._seat][f"{self._op} s"] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def count_collectives() -> None:
    """Wrap the collectives FSDP2 calls: bytes of the full tensor, time to completion."""

    def wrap(name: str, op: str, size_of: Any) -> None:
        original = getattr(dist, name, None)
        if original is None:  # another torch names it otherwise
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            if IN_HOOK.get():
                return original(*args, **kwargs)
            start = time.perf_counter()
            work = original(*args, **kwargs)
            record(op, size_of(*args, **kwargs), time.perf_counter() - start)
            return TimedWork(work, op, SEAT.get()) if work is not None else None

        setattr(dist, name, counted)

    def first(*args: Any, **kwargs: Any) -> Any:
        return args[0] if args else next(iter(kwargs.values()))

    def nbytes(tensor: Any) -> float:
        return float(tensor.numel() * tensor.element_size())

    def gathered(*a: Any, **k: Any) -> float:  # the output: the whole tensor
        return nbytes(a[0] if a else k.get("output_tensor", k.get("output")))

    def reduced(*a: Any, **k: Any) -> float:  # the input: every process's whole gradient
        return nbytes(a[1] if len(a) > 1 else k.get("input", k.get("input_tensor")))

    # torch 2.13's FSDP2 calls the *_single forms; earlier ones the *_tensor forms
    for name in ("all_gather_single", "all_gather_into_tensor"):
        wrap(name, "all-gather", gathered)
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        wrap(name, "reduce-scatter", reduced)
    wrap("all_reduce", "all-reduce", lambda *a, **k: nbytes(first(*a, **k)))


def count_ddp(learners: dict[str, Any]) -> None:
    """A DDP communication hook per seat: DDP's own all-reduce, counted."""
    for agent, learner in learners.items():
        ddp = getattr(learner, "policy", None)
        if not isinstance(ddp, DistributedDataParallel):
            continue

        def hook(state, bucket):  # unannotated: DDP checks the annotations it finds
            start, buffer = time.perf_counter(), bucket.buffer()
            TRAFFIC[state]["all-reduce bytes"] += buffer.numel() * buffer.element_size()

            def done(future: Any) -> Any:
                TRAFFIC[state]["all-reduce s"] += time.perf_counter() - start
                return future.value()

            token = IN_HOOK.set(True)
            try:
                return allreduce_hook(None, bucket).then(done)
            finally:
                IN_HOOK.reset(token)

        ddp.register_comm_hook(agent, hook)


class SeatProbe:
    """A learner probe (``cory_rl.agents.llm.Probe``) that marks its learner's work as the
    seat's."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    @contextlib.contextmanager
    def phase(self, name: str, learner: Any, **info: Any):  # noqa: ANN201
        token = SEAT.set(self.agent)
        try:
            yield
        finally:
            SEAT.reset(token)


def held_mb(learners: dict[str, Any]) -> dict[str, float]:
    """What this process holds between updates: the weights (its shards, or whole copies)
    of every policy, value head and reference, and the optimisers' moments; each storage
    counted once (seats share a reference, LoRA seats a base)."""
    seen: set[int] = set()

    def size(tensors: Any) -> float:
        total = 0
        for tensor in tensors:
            if not torch.is_tensor(tensor) or tensor.dim() == 0:
                continue
            storage = (tensor.to_local() if is_sharded(tensor) else tensor).untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total / 2**20

    weights = sum(
        size([*m.parameters(), *m.buffers()])
        for learner in learners.values()
        for m in (learner.model, learner.reference.lm)
    )
    moments = sum(
        size(v for state in learner.optimizer.state.values() for v in state.values())
        for learner in learners.values()
    )
    return {"weights": weights, "optimizer": moments}


class Clock(Callback):
    """Each iteration from its rollout to the end of its learning, and each phase's peak
    resident memory, on every process."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.phase_peaks: dict[str, float] = defaultdict(float)
        self.began = 0.0

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int):  # noqa: ANN201
        start = time.perf_counter()
        reset_rss_peak()
        yield
        self.phase_peaks[name] = max(self.phase_peaks[name], rss_peak_mb())
        if name == "rollout":
            self.began = start
        elif name == "learn":
            self.seconds.append(time.perf_counter() - self.began)


def worker(args: argparse.Namespace) -> None:
    """One process of one launch: train, then write this process's figures."""
    # the heap allocator training runs on (cory_rl.train.config.allocator)
    allocator.relaunch("auto")
    count_collectives()
    config = build_config(
        "smoke",
        algorithm=args.algorithm,
        overrides={
            "model": args.model,
            "device": args.device,
            "batch_size": args.batch_size,
            "iterations": args.iterations,
            "run_dir": args.run_dir,
            "report_to": ["none"],
            "checkpoint_every": 10**6,
            "lora": args.lora,
            "sharding": args.mode,
            "max_new_tokens": 8,
            "learner": {"mini_batch_size": args.batch_size},
        },
    )
    accelerator = make_accelerator(config)
    processes = Processes(accelerator)
    game, learners = build_game_and_learners(config, accelerator)
    for agent, learner in learners.items():
        learner.probe = SeatProbe(agent)
    if args.mode == "none":
        count_ddp(learners)
    clock = Clock()
    reset_rss_peak()
    train(config, learners, game, Path(args.run_dir), False, processes, callbacks=[clock])
    figures = {
        "mode": args.mode,
        "process": processes.index,
        "peak_rss_mb": max(clock.phase_peaks.values()),
        "phase_peak_mb": dict(clock.phase_peaks),
        "held_mb": held_mb(learners),
        "allocator": allocator.in_use(),
        "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20
        if torch.cuda.is_available()
        else None,
        "traffic": {seat: dict(v) for seat, v in TRAFFIC.items()},
        "s_per_iteration": clock.seconds[1:] or clock.seconds,
        "sharded": [learner.sharding is not None for learner in learners.values()],
    }
    out = Path(args.figures) / f"{args.mode}-{processes.index}.json"
    out.write_text(json.dumps(figures))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(args: argparse.Namespace, mode: str, figures: Path, run_dir: Path) -> None:
    name = (
        "fsdp2.yaml"
        if mode == "fsdp2"
        else f"multi_{'cpu' if args.device == 'cpu' else 'gpu'}.yaml"
    )
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "train" / "configs" / name),
        "--num_processes",
        str(args.processes),
        "--main_process_port",
        str(free_port()),
        "--module",
        "bench.bench_sharding",
        "--worker",
        mode,
        "--figures",
        str(figures),
        "--run_dir",
        str(run_dir),
        "--algorithm",
        args.algorithm,
        "--model",
        args.model,
        "--device",
        args.device,
        "--iterations",
        str(args.iterations),
        "--batch_size",
        str(args.batch_size),
        *(["--lora"] if args.lora else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
        raise SystemExit(f"the {mode} launch failed:\n" + "\n".join(errors[-20:]))


def mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def report(figures: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = {
        mode: [
            json.loads((figures / f"{mode}-{p}.json").read_text()) for p in range(args.processes)
        ]
        for mode in ("fsdp2", "none")
    }
    label = {"fsdp2": "FSDP2", "none": "DDP"}
    print(
        f"{args.algorithm}{' LoRA' if args.lora else ''}, {args.model}, {args.processes} "
        f"processes on {args.device} ({args.threads} thread(s) each), batch {args.batch_size} "
        f"per process, {args.iterations} iterations (the first a warm-up)"
    )
    print(f"\nheap allocator: {rows['fsdp2'][0]['allocator']}")
    print(
        "\n| run | process | weights held MB | optimiser moments MB | peak resident MB | "
        "CUDA peak MB | s / iteration |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, procs in rows.items():
        for r in procs:
            cuda = "" if r["cuda_peak_mb"] is None else f"{r['cuda_peak_mb']:.0f}"
            s = sum(r["s_per_iteration"]) / len(r["s_per_iteration"])
            held = r["held_mb"]
            print(
                f"| {label[mode]} | {r['process']} | {held['weights']:.1f} | "
                f"{held['optimizer']:.1f} | {r['peak_rss_mb']:.0f} | {cuda} | {s:.2f} |"
            )
    phases = list(rows["fsdp2"][0]["phase_peak_mb"])
    print("\nPeak resident MB per phase, process 0:\n")
    print("| run | " + " | ".join(phases) + " |")
    print("|---|" + "---|" * len(phases))
    for mode, procs in rows.items():
        peaks = procs[0]["phase_peak_mb"]
        print(f"| {label[mode]} | " + " | ".join(f"{peaks.get(n, 0):.0f}" for n in phases) + " |")
    print(
        "\n| run | seat | all-gathered MB | reduce-scattered MB | all-reduced MB | "
        "seconds in collectives |"
    )
    print("|---|---|---|---|---|---|")
    for mode, procs in rows.items():
        traffic = procs[0]["traffic"]  # process 0's; every process moves the same bytes
        for seat in sorted(traffic):
            t = traffic[seat]
            secs = sum(v for k, v in t.items() if k.endswith(" s"))
            print(
                f"| {label[mode]} | {seat} | {mb(t.get('all-gather bytes', 0))} | "
                f"{mb(t.get('reduce-scatter bytes', 0))} | {mb(t.get('all-reduce bytes', 0))} "
                f"| {secs:.2f} |"
            )
    peak = {m: max(r["peak_rss_mb"] for r in procs) for m, procs in rows.items()}
    held = {m: max(sum(r["held_mb"].values()) for r in procs) for m, procs in rows.items()}
    speed = {
        m: sum(sum(r["s_per_iteration"]) / len(r["s_per_iteration"]) for r in procs) / len(procs)
        for m, procs in rows.items()
    }
    ratio = {k: v["fsdp2"] / v["none"] for k, v in (("held", held), ("peak", peak))}
    print(
        f"\nFSDP2 / DDP: weights and moments held per process {ratio['held']:.2f}x, "
        f"peak resident memory per process {ratio['peak']:.2f}x, "
        f"seconds per iteration {speed['fsdp2'] / speed['none']:.2f}x"
    )
    settings = {
        k: v for k, v in vars(args).items() if k not in ("out", "figures", "run_dir", "worker")
    }
    return {"settings": settings, "commit": commit(ROOT), "runs": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="cory")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, help="also write every figure here (JSON)")
    parser.add_argument("--worker", choices=("fsdp2", "none"), help=argparse.SUPPRESS)
    parser.add_argument("--figures", help=argparse.SUPPRESS)
    parser.add_argument("--run_dir", help=argparse.SUPPRESS)
    args = smoke.parse_args(parser, argv, SMOKE)
    if args.worker:
        args.mode = args.worker
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp, smoke.model_for(args):
        for mode in ("fsdp2", "none"):
            launch(args, mode, Path(tmp), Path(tmp) / f"run-{mode}")
        result = report(Path(tmp), args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
