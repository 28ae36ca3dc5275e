"""Wire a config to a game and learners, then hand them to the training loop."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agents.base import Learner
from agents.policy import ModelPool
from agents.registry import Seat, build_learner
from agents.state_io import CheckpointError
from cory_env import BatchedTextGame, load_causal_lm, load_tokenizer, pad_token_id
from cory_env.checks import SettingError
from train import allocator
from train.config import TrainConfig, parse_args
from train.distributed import Processes
from train.loop import RunDirectory, make_game, train
from train.summary import run_summary


def make_accelerator(config: TrainConfig) -> Any:
    from accelerate import Accelerator

    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but no CUDA device is visible; use --device cpu or auto")
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    return Accelerator(cpu=use_cpu, mixed_precision=config.mixed_precision)


def lora_config(config: TrainConfig) -> Any:
    if not config.lora:
        return None
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise ImportError("lora=True needs peft: pip install 'peft>=0.12'") from err
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=config.lora_target_modules,
        task_type="CAUSAL_LM",
    )


def default_run_dir(config: TrainConfig) -> Path:
    return Path("runs") / f"{config.algorithm}-{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_game_and_learners(
    config: TrainConfig, accelerator: Any = None
) -> tuple[BatchedTextGame, dict[str, Learner]]:
    """The seeded game and one learner per seat, built from the registry.

    Seats of one base model share its frozen reference (``ModelPool``); every seat is
    tokenised with its own model's tokenizer.
    """
    from accelerate.utils import set_seed

    set_seed(config.seed)
    accelerator = accelerator or make_accelerator(config)
    seat_models = config.seat_models()
    tokenizers = {agent: load_tokenizer(model) for agent, model in seat_models.items()}
    game = make_game(config, list(tokenizers.values()))
    pool = ModelPool(
        partial(load_causal_lm, load_in_4bit=config.load_in_4bit),
        lora_config(config),
        activation_checkpointing=config.activation_checkpointing,
    )
    learners: dict[str, Learner] = {}
    for i, (agent, (name, settings)) in enumerate(config.seat_learners().items()):
        seat = Seat(
            agent=agent,
            index=i,
            n_agents=config.n_agents,
            settings=settings,
            tokenizer=tokenizers[agent],
            vocab_size=int(game.action_space(agent).n),
            pad_token_id=pad_token_id(tokenizers[agent]),
            model=seat_models[agent],
            models=pool,
            accelerator=accelerator,
            seed=Processes(accelerator).game_seed(config.seed) + 1000 * i,
            group_size=config.group_size,
        )
        learners[agent] = build_learner(name, seat)
    return game, learners


RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoint", "checkpoint.old")


def check_run_path(run_path: Path, resume: bool) -> None:
    """Refuse a folder that cannot take this run, before any model is loaded."""
    if run_path.exists() and not run_path.is_dir():
        raise NotADirectoryError(f"run_dir {run_path} is a file, not a folder; pick another path")
    if resume:
        if not run_path.is_dir():
            raise FileNotFoundError(f"--resume {run_path}: no such run folder")
        return
    held = [name for name in RUN_FILES if (run_path / name).exists()]
    if held:
        hint = (
            "continue it with --resume"
            if (run_path / "checkpoint").exists() or (run_path / "checkpoint.old").exists()
            else "it has no checkpoint to resume from (a crashed run?): delete it"
        )
        raise FileExistsError(
            f"{run_path} already holds a run ({', '.join(held)}); pick a new --run_dir, or {hint}"
        )


def run_training(config: TrainConfig, resume_dir: Path | None = None) -> RunDirectory | None:
    """Train a config; under ``accelerate launch`` each process calls this (see loop.train)."""
    run_path = Path(resume_dir or config.run_dir or default_run_dir(config))
    check_run_path(run_path, resume=resume_dir is not None)
    accelerator = make_accelerator(config)
    processes = Processes(accelerator)
    if processes.num > 1 and config.lora and config.n_agents > 1:
        raise SettingError(
            "lora with several seats shares one base model between the agents, which "
            "data-parallel training (DDP) cannot wrap; run it in one process or without lora"
        )
    if processes.num > 1 and config.run_dir is None and resume_dir is None:
        raise SettingError("several processes need one --run_dir (a time-stamped default "
                           "could differ between them)")  # fmt: skip
    game, learners = build_game_and_learners(config, accelerator)
    run = train(config, learners, game, run_path, resume_dir is not None, processes)
    if run is not None:
        print(run_summary(run.path))
    return run


def main(algorithm: str, argv: list[str] | None = None) -> RunDirectory | None:
    """The training scripts' entry: a bad setting, folder or checkpoint exits with one line.

    Run from the command line (``argv`` None), it first re-executes itself on the
    configured heap allocator (train/allocator.py)."""
    config, resume = parse_args(argv, algorithm=algorithm)
    if argv is None:
        allocator.relaunch(config.allocator, lean=config.activation_checkpointing)
    try:
        return run_training(config, resume)
    except (
        FileExistsError,
        FileNotFoundError,
        NotADirectoryError,
        CheckpointError,
        SettingError,
    ) as err:
        raise SystemExit(f"error: {err}") from None
