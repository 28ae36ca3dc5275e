"""Wire a config to a game and learners, then hand them to the training loop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from agents.ppo import PPOAgent, build_policies
from cory_env import BatchedTextGame, load_causal_lm, load_tokenizer
from train.config import TrainConfig, parse_args
from train.loop import RunDirectory, make_game, train


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


def build_ppo_learners(
    config: TrainConfig, agents: list[str], tokenizer: Any, accelerator: Any
) -> dict[str, PPOAgent]:
    """One PPO learner per seat, all from one base model and one shared reference."""
    base = load_causal_lm(config.model)
    policies, reference = build_policies(base, len(agents), lora_config(config))
    return {
        agent: PPOAgent(
            policy,
            reference,
            config.ppo,
            tokenizer.pad_token_id,
            accelerator,
            seed=config.seed + 1000 * i,
        )
        for i, (agent, policy) in enumerate(zip(agents, policies, strict=False))
    }


def default_run_dir(config: TrainConfig) -> Path:
    return Path("runs") / f"{config.algorithm}-{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_game_and_learners(config: TrainConfig) -> tuple[BatchedTextGame, dict[str, PPOAgent]]:
    """The seeded game and its PPO learners, as training and evaluation both need them."""
    from accelerate.utils import set_seed

    set_seed(config.seed)
    accelerator = make_accelerator(config)
    tokenizer = load_tokenizer(config.model)
    game = make_game(config, tokenizer)
    learners = build_ppo_learners(config, game.possible_agents, tokenizer, accelerator)
    return game, learners


def run_training(config: TrainConfig, resume_dir: Path | None = None) -> RunDirectory:
    run_path = Path(resume_dir or config.run_dir or default_run_dir(config))
    if resume_dir is None and (run_path / "checkpoint").exists():
        raise FileExistsError(
            f"{run_path} already holds a run; pick a new --run_dir or continue it with --resume"
        )
    game, learners = build_game_and_learners(config)
    run = train(config, learners, game, run_path, resume=resume_dir is not None)
    print(f"run folder: {run.path}  (metrics.jsonl, samples.jsonl, curves.png, checkpoint/)")
    return run


def main(algorithm: str, argv: list[str] | None = None) -> RunDirectory:
    config, resume = parse_args(argv, algorithm=algorithm)
    return run_training(config, resume)
