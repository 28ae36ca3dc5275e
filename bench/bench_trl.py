"""This project's GRPO and RLOO learners next to TRL 1.x's ``GRPOTrainer`` and ``RLOOTrainer``
on the same work: seconds per step, peak memory and the tokens generated and trained on.

One step is one generation cycle and every optimiser step taken on it, on both sides; each
side runs in its own process, one after the other, so that each peak is its own. What is
matched (model, prompts in order, reward, budgets, learning rate, epochs, mini-batches, KL,
clipping, loss reduction) and what cannot be, and why: docs/bench-trl.md. It prints both
sides' figures and their ratios, measured in this one run, and a MISMATCH line for every
count or prompt list that differs.

    python -m bench.bench_trl [--learners grpo rloo] [--steps 4] [--prompts 8]
        [--group_size 4] [--new_tokens 15] [--epochs 1] [--learning_rate 1e-6]
        [--beta B] [--mini_batch_size N] [--gradient_accumulation_steps 1]
        [--max_grad_norm 1.0] [--activation_checkpointing] [--threads N]
        [--device cpu|cuda] [--allocator auto|mimalloc|system] [--out FILE] [--logs DIR]
        [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench import smoke
from bench.provenance import code_version
from cory_env import load_causal_lm, load_tokenizer
from cory_env.query import Query
from cory_env.rewards import VaderSentimentReward
from cory_rl.train.config import allocator
from cory_rl.train.core.callbacks import Callback

LEARNERS = ("grpo", "rloo")
TRL_BETA = {"grpo": 0.0, "rloo": 0.05}
"""TRL 1.16's default KL coefficients (``GRPOConfig.beta``, ``RLOOConfig.beta``)."""
TRL_NAMES = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
EPSILON = 0.2
"""Both sides' clipping range (TRL ``epsilon``, ours ``clip_range``): the two defaults."""
KL_PENALTY = {"rloo": "k1", "grpo": "k3_in_loss"}
"""The KL penalty TRL uses (``agents/kl_penalty.py``): RLOO's k1 of the sampling policy in
the reward, GRPO's k3 differentiated in the loss."""
SIDES = ("ours", "trl")
SMOKE = {"model": None, "steps": 2, "prompts": 2, "group_size": 2, "new_tokens": 3}
"""``--smoke``: both learners and both sides, 2 steps (the first a warm-up) of 4 answers of
the tiny model."""


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Plan:
    """How one step's answers split into optimiser steps, shared by both sides."""

    prompts: int
    group_size: int
    mini_batch_size: int
    gradient_accumulation_steps: int
    epochs: int

    @property
    def answers(self) -> int:
        """Completions per step: our batch, TRL's generation batch."""
        return self.prompts * self.group_size

    @property
    def micro_batch_size(self) -> int:
        return self.mini_batch_size // self.gradient_accumulation_steps

    @property
    def optimizer_steps(self) -> int:
        """Optimiser steps per step: ``epochs`` passes, one per mini-batch."""
        return self.epochs * self.answers // self.mini_batch_size

    def check(self) -> None:
        """Refuse a split that one side could not take, before any process starts."""
        for name in (
            "prompts",
            "group_size",
            "mini_batch_size",
            "gradient_accumulation_steps",
            "epochs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be at least 2 (a group baseline), got {self.group_size}"
            )
        if self.answers % self.mini_batch_size:
            raise ValueError(
                f"prompts x group_size ({self.answers}) must be a multiple of mini_batch_size "
                f"({self.mini_batch_size})"
            )
        if self.mini_batch_size % self.gradient_accumulation_steps:
            raise ValueError(
                f"mini_batch_size ({self.mini_batch_size}) must be a multiple of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps})"
            )


def make_plan(args: argparse.Namespace) -> Plan:
    answers = args.prompts * args.group_size
    plan = Plan(
        prompts=args.prompts,
        group_size=args.group_size,
        mini_batch_size=args.mini_batch_size or answers,  # TRL's default: the whole batch
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        epochs=args.epochs,
    )
    plan.check()
    return plan


def beta_for(args: argparse.Namespace, learner: str) -> float:
    """``--beta`` if given, else TRL 1.16's default for the learner."""
    return TRL_BETA[learner] if args.beta is None else float(args.beta)


def our_overrides(args: argparse.Namespace, learner: str, run_dir: str | None = None) -> dict:
    """``build_config`` overrides that make our learner do TRL's work (module docstring)."""
    plan = make_plan(args)
    settings: dict[str, Any] = {
        "learning_rate": args.learning_rate,
        "mini_batch_size": plan.mini_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "forward_batch_size": plan.micro_batch_size,  # TRL computes one micro-batch at a time
        "ppo_epochs": plan.epochs,
        "clip_range": EPSILON,
        "init_kl_coef": beta_for(args, learner),
        "adaptive_kl": False,
        "kl_penalty": KL_PENALTY[learner],
        "whiten_advantages": False,
        "score_scaling": False,
        "score_norm": False,
        "score_clip": None,
        "max_grad_norm": args.max_grad_norm if args.max_grad_norm > 0 else None,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "repetition_penalty": 1.0,  # the algorithms' official default is 1.1; TRL's is 1.0
    }
    if learner == "grpo":
        settings.update(scale_rewards="group", loss_type="dapo")
    return {
        "model": args.model,
        "task": "imdb",
        "task_settings": {"reward": "vader"},
        "batch_size": plan.answers,
        "group_size": plan.group_size,
        "max_new_tokens": args.new_tokens,
        "iterations": args.steps,
        "seed": args.seed,
        "device": args.device,
        "mixed_precision": "bf16" if args.bf16 else "no",
        "activation_checkpointing": args.activation_checkpointing,
        "allocator": args.allocator,
        "run_dir": run_dir,
        "sample_every": args.steps,
        "checkpoint_every": args.steps,
        "n_samples": 0,
        "eval_every": 0,
        "report_to": ["none"],
        "learner": settings,
    }


def trl_kwargs(args: argparse.Namespace, learner: str, output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` / ``RLOOConfig`` arguments for the same work as :func:`our_overrides`.

    One process: ``generation_batch_size = per_device_train_batch_size x
    steps_per_generation`` completions are generated at once (the answers of one step);
    each optimiser step accumulates ``gradient_accumulation_steps`` micro-batches of them,
    and the batch is used ``num_iterations`` times before the next generation."""
    plan = make_plan(args)
    kwargs: dict[str, Any] = {
        "output_dir": output_dir,
        "use_cpu": args.device == "cpu",
        "bf16": args.bf16,
        "fp16": False,
        "activation_checkpointing": args.activation_checkpointing,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": args.seed,
        "max_steps": args.steps * plan.optimizer_steps,
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": args.max_grad_norm,
        "per_device_train_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "steps_per_generation": plan.answers // plan.micro_batch_size,
        "num_generations": plan.group_size,
        "max_completion_length": args.new_tokens,
        "generation_kwargs": {"min_new_tokens": args.new_tokens},
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
        "num_iterations": plan.epochs,
        "beta": beta_for(args, learner),
        "epsilon": EPSILON,
        "shuffle_dataset": False,  # the prompts come in our order
        "disable_dropout": True,
        "use_vllm": False,
        "dataloader_num_workers": 0,
    }
    if learner == "grpo":
        kwargs.update(loss_type="dapo", scale_rewards="group", use_bias_correction_kl=False)
    else:
        kwargs.update(normalize_advantages=False)
    return kwargs


def trl_completions_per_cycle(kwargs: dict[str, Any], num_processes: int = 1) -> int:
    """Completions TRL generates at once: ``generation_batch_size`` as GRPOConfig derives it."""
    if kwargs.get("generation_batch_size") is not None:
        return int(kwargs["generation_batch_size"])
    steps = kwargs.get("steps_per_generation") or kwargs.get("gradient_accumulation_steps", 1)
    return int(kwargs["per_device_train_batch_size"] * num_processes * steps)


def trl_optimizer_steps_per_cycle(kwargs: dict[str, Any]) -> float:
    """Optimiser steps between two generations: micro-batches per cycle over accumulation."""
    steps = kwargs.get("steps_per_generation") or kwargs.get("gradient_accumulation_steps", 1)
    micro_steps = steps * kwargs.get("num_iterations", 1)
    return micro_steps / kwargs.get("gradient_accumulation_steps", 1)


# ----------------------------------------------------------------------------- measuring
def process_peak_mb() -> float:
    """This process's lifetime peak resident memory (MB, getrusage): never reset, unlike
    ``cory_rl.train.core.memory.rss_peak_mb``, which a run resets at its start."""
    scale = 1024 if sys.platform != "darwin" else 1024**2
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def in_cycles(values: Sequence[float], per_cycle: int) -> list[float]:
    """Per-optimiser-step values summed per generation cycle of ``per_cycle`` steps."""
    if per_cycle < 1 or len(values) % per_cycle:
        raise ValueError(f"{len(values)} optimiser steps do not split into cycles of {per_cycle}")
    return [float(sum(values[i : i + per_cycle])) for i in range(0, len(values), per_cycle)]


def steady_mean(values: Sequence[float]) -> float:
    """The mean after the first value (a warm-up); of the one value if there is one."""
    if not values:
        raise ValueError("no steps were measured")
    kept = values[1:] or values
    return float(sum(kept) / len(kept))


class OurTokens:
    """A ``cory_rl.agents.llm.Probe``: counts the completion tokens sampled (``end_rollout``) and
    those run through the policy's training forward (``forward``: the last ``keep - 1``
    positions are the response, right-padded)."""

    def __init__(self) -> None:
        self.generated = 0
        self.trained = 0

    @contextlib.contextmanager
    def phase(self, name: str, learner: Any, **info: Any) -> Iterator[None]:
        if name == "end_rollout":
            self.generated += int(sum(int(n) for n in info["obs"]["num_generated"]))
        elif name == "forward":
            _, attention, _ = info["inputs"]
            self.trained += int(attention[:, -(info["keep"] - 1) :].sum())
        yield


class OurSteps(Callback):
    """The loop's callback: each iteration's seconds (rollout + learn), tokens, queries,
    score and the process's peak memory after it."""

    def __init__(self, game: Any, group_size: int, tokens: OurTokens) -> None:
        self.game, self.group_size, self.tokens = game, group_size, tokens
        self.seconds: list[float] = []
        self.generated: list[int] = []
        self.trained: list[int] = []
        self.prompts: list[list[str]] = []
        self.rewards: list[float] = []
        self.peak_mb: list[float] = []
        self._start = 0.0

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int) -> Iterator[None]:
        if name == "rollout":
            self.tokens.generated = self.tokens.trained = 0
            self._start = time.perf_counter()
        yield
        if name == "rollout":
            self.prompts.append([q.text for q in self.game.queries[:: self.group_size]])
        elif name == "learn":
            self.seconds.append(time.perf_counter() - self._start)
            self.generated.append(self.tokens.generated)
            self.trained.append(self.tokens.trained)
            self.peak_mb.append(process_peak_mb())

    def on_row(self, row: dict[str, Any]) -> None:
        if "score_mean" in row:
            self.rewards.append(float(row["score_mean"]))


def run_ours(args: argparse.Namespace, learner: str) -> dict[str, Any]:
    """Train ``args.steps`` iterations of our learner through the real loop, measured."""
    # Each side's process imports only its own side, so that each peak memory is its own:
    # our loop, game and learners here, TRL (about 100 MB resident) in run_trl.
    import cory_rl.train.training.loop as loop
    from cory_rl.train.config.resolve import build_config
    from cory_rl.train.core.build import build_game_and_learners
    from cory_rl.train.core.checkpoint import CheckpointWriter

    class NoCheckpoints(CheckpointWriter):
        """Writes nothing: TRL saves nothing here either."""

        def save(self, *args: Any, **kwargs: Any) -> None:
            return None

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / f"ours-{learner}"
        config = build_config(
            overrides=our_overrides(args, learner, str(run_dir)), algorithm=learner
        )
        game, learners = build_game_and_learners(config)
        tokens = OurTokens()
        for seat in learners.values():
            seat.probe = tokens
        steps = OurSteps(game, config.game.group_size, tokens)
        loop.train(config, learners, game, run_dir, callbacks=[steps], checkpoints=NoCheckpoints())
    return {
        "side": "ours",
        "learner": learner,
        "seconds": steps.seconds,
        "generated": steps.generated,
        "trained": steps.trained,
        "prompts": steps.prompts,
        "rewards": steps.rewards,
        "peak_mb_after_step": steps.peak_mb,
        "cuda_peak_mb": _cuda_peak_mb(),
        "settings": config.to_dict(),
        "allocator": allocator.describe(),
        "threads": torch.get_num_threads(),
    }


def _cuda_peak_mb() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def run_trl(args: argparse.Namespace, learner: str, prompts: list[list[str]]) -> dict[str, Any]:
    """Train TRL's trainer for the same steps on the same prompts, measured."""
    # TRL's side only, as run_ours's imports are ours only: each peak memory is its own.
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    plan = make_plan(args)
    trainer_class = getattr(trl, TRL_NAMES[learner])
    config_class = getattr(trl, TRL_NAMES[learner].replace("Trainer", "Config"))
    score = VaderSentimentReward()
    generated: list[int] = []
    seen_prompts: list[list[str]] = []
    rewards: list[float] = []
    step_seconds: list[float] = []
    step_trained: list[int] = []
    peak_mb: list[float] = []
    counter = {"trained": 0, "start": 0.0}

    def vader(prompts: list[str], completions: list[str], completion_ids: list, **_: Any):
        """The project's VADER reward on prompt + completion, as our game scores them."""
        scores = score([Query(p) for p in prompts], completions)
        generated.append(sum(len(ids) for ids in completion_ids))
        seen_prompts.append(list(prompts[:: plan.group_size]))
        rewards.append(sum(scores) / len(scores))
        return scores

    class Counting(trainer_class):
        """Counts the completion tokens each loss is computed on; changes nothing."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            counter["trained"] += int(inputs["completion_mask"].sum())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    class StepTimer(TrainerCallback):
        """Seconds and tokens of every optimiser step, and the peak memory after it."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            counter["trained"] = 0
            counter["start"] = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_seconds.append(time.perf_counter() - counter["start"])
            step_trained.append(counter["trained"])
            peak_mb.append(process_peak_mb())

    flat = [p for step in prompts for p in step]
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = trl_kwargs(args, learner, tmp)
        config = config_class(**kwargs)
        derived = (config.generation_batch_size, config.steps_per_generation)
        if derived != (plan.answers, kwargs["steps_per_generation"]) or (
            trl_completions_per_cycle(kwargs) != config.generation_batch_size
        ):
            raise RuntimeError(
                f"{config_class.__name__} derived generation_batch_size, steps_per_generation = "
                f"{derived}; the bench planned {plan.answers} completions per step"
            )
        trainer = Counting(
            model=load_causal_lm(args.model),
            reward_funcs=[vader],
            args=config,
            train_dataset=Dataset.from_dict({"prompt": flat}),
            processing_class=load_tokenizer(args.model),
            callbacks=[StepTimer()],
        )
        trainer.train()
    per_cycle = plan.optimizer_steps
    return {
        "side": "trl",
        "learner": learner,
        "seconds": in_cycles(step_seconds, per_cycle),
        "generated": generated,
        "trained": [int(n) for n in in_cycles(step_trained, per_cycle)],
        "prompts": seen_prompts,
        "rewards": rewards,
        "peak_mb_after_step": peak_mb[per_cycle - 1 :: per_cycle],
        "cuda_peak_mb": _cuda_peak_mb(),
        "settings": {k: v for k, v in kwargs.items() if k != "output_dir"},
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__},
        "allocator": allocator.describe(),
        "threads": torch.get_num_threads(),
    }


# ----------------------------------------------------------------------------- processes
def child_environment(args: argparse.Namespace) -> dict[str, str]:
    """Both sides' environment: training's heap allocator (cory_rl.train.config.allocator)."""
    env = allocator.relaunch_environment(
        args.allocator,
        os.environ,
        allocator.mimalloc_library(),
        lean=args.activation_checkpointing,
    )
    return dict(os.environ if env is None else env)


def run_child(
    argv: list[str],
    side: str,
    learner: str,
    workdir: Path,
    env: dict[str, str],
    prompts_file: Path | None = None,
) -> dict[str, Any]:
    """One side in its own process; its result, with the process's peak memory (wait4)."""
    result = workdir / f"{side}-{learner}.json"
    log = workdir / f"{side}-{learner}.log"
    command = [
        sys.executable,
        "-m",
        "bench.bench_trl",
        *argv,
        "--child",
        side,
        "--learner",
        learner,
        "--result",
        str(result),
    ]
    if prompts_file is not None:
        command += ["--prompts_file", str(prompts_file)]
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        if hasattr(os, "wait4"):
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            scale = 1024 if sys.platform != "darwin" else 1024**2
            process_peak = usage.ru_maxrss / scale
        else:
            proc.wait()
            process_peak = None
    if proc.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"{side} {learner} failed ({proc.returncode}); its last lines:\n{tail}")
    data = json.loads(result.read_text())
    data["process_peak_mb"] = process_peak
    data["wall_s"] = time.perf_counter() - start
    return data


def summarise(data: dict[str, Any]) -> dict[str, float]:
    """One side's numbers per step (means after the warm-up step; memory: the peak)."""
    peak = data.get("process_peak_mb") or max(data["peak_mb_after_step"])
    if data.get("cuda_peak_mb"):
        peak = data["cuda_peak_mb"]
    return {
        "seconds_per_step": steady_mean(data["seconds"]),
        "peak_gb": peak / 1024,
        "generated_per_step": steady_mean(data["generated"]),
        "trained_per_step": steady_mean(data["trained"]),
        "reward": steady_mean(data["rewards"]),
    }


def mismatches(learner: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """A MISMATCH line for each per-step count or prompt list that differs between sides."""
    lines = []
    for key, what in (("generated", "tokens generated"), ("trained", "tokens trained on")):
        if list(ours[key]) != list(theirs[key]):
            lines.append(
                f"MISMATCH {learner}: {what} per step: ours {list(ours[key])} vs TRL "
                f"{list(theirs[key])}"
            )
    if ours["prompts"] != theirs["prompts"]:
        lines.append(f"MISMATCH {learner}: the sides answered different prompts")
    return lines


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The table: per learner ours, TRL and ours/TRL; then any MISMATCH lines."""
    plan = make_plan(args)
    header = (
        f"{'run':<22}{'s/step':>9}{'peak GB':>9}{'gen tok/step':>14}"
        f"{'trained tok/step':>18}{'reward':>9}"
    )
    lines = [header, "-" * len(header)]
    problems = []
    for learner, sides in results.items():
        ours, theirs = summarise(sides["ours"]), summarise(sides["trl"])
        for name, s in ((f"ours {learner}", ours), (f"TRL {TRL_NAMES[learner]}", theirs)):
            lines.append(
                f"{name:<22}{s['seconds_per_step']:>9.2f}{s['peak_gb']:>9.2f}"
                f"{s['generated_per_step']:>14.0f}{s['trained_per_step']:>18.0f}"
                f"{s['reward']:>9.3f}"
            )
        time_ratio = ours["seconds_per_step"] / theirs["seconds_per_step"]
        memory_ratio = ours["peak_gb"] / theirs["peak_gb"]
        lines.append(f"{'  ours/TRL':<22}{time_ratio:>8.2f}x{memory_ratio:>8.2f}x")
        sides["summary"] = {
            "ours": ours,
            "trl": theirs,
            "time_ratio": time_ratio,
            "memory_ratio": memory_ratio,
        }
        problems += mismatches(learner, sides["ours"], sides["trl"])
    measured = max(args.steps - 1, 1)
    lines.append(
        f"s/step: mean of {measured} step(s) after the first (warm-up); one step = "
        f"{plan.answers} completions ({plan.prompts} prompts x {plan.group_size}) and "
        f"{plan.optimizer_steps} optimiser step(s); peak GB: the process's peak resident "
        "memory (CUDA: peak allocated); tokens: completion tokens per step"
    )
    return lines + (problems or ["token counts and prompts match between the sides"])


def title(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> str:
    plan = make_plan(args)
    first = next(iter(results.values()))
    versions = first["trl"].get("versions", {})
    betas = ", ".join(f"{learner} beta {beta_for(args, learner)}" for learner in results)
    return (
        f"bench_trl: model {args.model}, {plan.prompts} prompts x {plan.group_size} = "
        f"{plan.answers} completions per step, {args.new_tokens} new tokens, {plan.epochs} "
        f"pass(es), mini-batch {plan.mini_batch_size} (micro {plan.micro_batch_size}), lr "
        f"{args.learning_rate:g}, max_grad_norm {args.max_grad_norm:g}, {betas}, "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}, {args.device}, "
        f"{first['ours']['threads']} threads, {first['ours']['allocator']} "
        f"allocator, TRL {versions.get('trl', '?')}, transformers "
        f"{versions.get('transformers', '?')}, {platform.machine()}"
    )


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", nargs="+", choices=LEARNERS, default=list(LEARNERS))
    parser.add_argument("--steps", type=int, default=4, help="the first is a warm-up")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group_size", type=int, default=4, help="answers per prompt")
    parser.add_argument("--new_tokens", type=int, default=15, help="64: the long setting")
    parser.add_argument("--epochs", type=int, default=1, help="ppo_epochs = num_iterations")
    parser.add_argument("--learning_rate", type=float, default=1e-6, help="TRL's default")
    parser.add_argument("--beta", type=float, default=None, help="default TRL's per learner")
    parser.add_argument("--mini_batch_size", type=int, default=None, help="default: the batch")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--max_grad_norm", type=float, default=1.0, help="0 = no clipping")
    parser.add_argument("--activation_checkpointing", action="store_true", help="both sides")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast on both sides (TRL's default; ours --mixed_precision bf16)",
    )
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--allocator", choices=("auto", "mimalloc", "system"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="save the results as JSON here")
    parser.add_argument("--logs", default=None, help="keep each process's output here")
    # Set by the parent for each side's process.
    parser.add_argument("--child", choices=SIDES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--learner", choices=LEARNERS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts_file", default=None, help=argparse.SUPPRESS)
    args = smoke.parse_args(parser, argv, SMOKE)
    try:
        make_plan(args)
    except ValueError as err:
        parser.error(str(err))
    if args.steps < 1 or args.new_tokens < 1:
        parser.error("--steps and --new_tokens must be at least 1")
    return args


def child_main(args: argparse.Namespace) -> None:
    """One side, in this process: train, then write the result file."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child == "ours":
        data = run_ours(args, args.learner)
    else:
        prompts = json.loads(Path(args.prompts_file).read_text())
        data = run_trl(args, args.learner, prompts)
    Path(args.result).write_text(json.dumps(data, default=str))


def run_sides(args: argparse.Namespace, argv: list[str]) -> dict[str, dict[str, Any]]:
    """Per learner, ours and then TRL's trainer on the prompts ours answered, each in a
    process of its own."""
    env = child_environment(args)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.logs or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for learner in args.learners:
            print(f"ours {learner} ...", flush=True)
            ours = run_child(argv, "ours", learner, workdir, env)
            prompts_file = workdir / f"prompts-{learner}.json"
            prompts_file.write_text(json.dumps(ours["prompts"]))
            print(f"TRL {TRL_NAMES[learner]} ...", flush=True)
            theirs = run_child(argv, "trl", learner, workdir, env, prompts_file)
            results[learner] = {"ours": ours, "trl": theirs}
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child is not None:
        child_main(args)
        return {}
    with smoke.model_for(args):  # both sides on one model (a smoke run's too)
        results = run_sides(args, [*argv, "--model", args.model])
    lines = [
        title(args, results),
        f"code: {code_version()}",
        *report(results, args),
    ]
    print("\n".join(lines), flush=True)
    if args.out:
        out = {
            "args": vars(args),
            "plan": asdict(make_plan(args)),
            "report": lines,
            "results": results,
        }
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
