"""One config for every training script: a dataclass, presets, YAML files and CLI flags.

Precedence, lowest first: dataclass defaults < ``--preset`` < ``--config file.yaml`` <
explicit flags. Every run saves its resolved config as ``config.yaml`` in its run folder,
and ``--config run/config.yaml`` reproduces it.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.ppo import PPOConfig


@dataclass
class TrainConfig:
    """Everything a run needs; PPO's own hyper-parameters live in ``ppo``."""

    algorithm: str = "cory"
    """``cory`` (two agents, collective reward, role exchange) or ``ppo`` (one agent)."""
    task: str = "imdb"
    task_settings: dict[str, Any] = field(default_factory=dict)
    model: str = "embedded"
    """Hugging Face model id, local folder, or ``embedded`` (SmolLM2-135M-Instruct offline)."""
    lam: float = 1.0
    role_exchange_period: int = 5
    max_new_tokens: Any = None
    """int, or [low, high) drawn per iteration; None = the task's default."""
    context_length: int | None = None
    batch_size: int = 32
    iterations: int = 100
    seed: int = 0
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    mixed_precision: str = "no"
    """``no`` or ``bf16``."""
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target_modules: Any = "all-linear"
    eta: float = 0.01
    """Weight of KL in the reported combined objective ``r - eta * KL``."""
    run_dir: str | None = None
    """Folder of this run; default ``runs/<algorithm>-<task>-<time>``."""
    sample_every: int = 5
    checkpoint_every: int = 10
    n_samples: int = 4
    ppo: PPOConfig = field(default_factory=PPOConfig)

    @property
    def n_agents(self) -> int:
        return 2 if self.algorithm == "cory" else 1

    def validate(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(
                f"mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}"
            )
        for name in ("batch_size", "iterations", "sample_every", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.batch_size % self.ppo.mini_batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of ppo.mini_batch_size "
                f"({self.ppo.mini_batch_size})"
            )
        self.ppo.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


ALGORITHMS = ("cory", "ppo")

PRESETS: dict[str, dict[str, Any]] = {
    # A few minutes on 2 CPU cores: proves the whole path end to end (README, CI).
    "smoke": {
        "batch_size": 8,
        "iterations": 3,
        "max_new_tokens": [4, 9],
        "role_exchange_period": 2,
        "sample_every": 1,
        "checkpoint_every": 2,
        "n_samples": 2,
        "ppo": {"mini_batch_size": 8, "ppo_epochs": 2, "learning_rate": 1e-5},
    },
    # The embedded model on 2 CPU cores, long enough to show learning.
    "cpu": {
        "batch_size": 32,
        "iterations": 60,
        "max_new_tokens": [4, 12],
        "sample_every": 5,
        "checkpoint_every": 10,
        "ppo": {"mini_batch_size": 16, "ppo_epochs": 4, "learning_rate": 2e-5, "init_kl_coef": 0.1},
    },
    # The paper's IMDB settings: GPT2-Large, distilbert-imdb logits, one GPU.
    "paper-imdb": {
        "model": "gpt2-large",
        "batch_size": 128,
        "iterations": 200,
        "max_new_tokens": [4, 16],
        "role_exchange_period": 5,
        "mixed_precision": "no",
        "task_settings": {"dataset": "stanfordnlp/imdb", "reward": "lvwerra/distilbert-imdb"},
        "ppo": {
            "mini_batch_size": 128,
            "gradient_accumulation_steps": 8,
            "ppo_epochs": 4,
            "learning_rate": 1.41e-5,
            "init_kl_coef": 0.3,
            "kl_target": 6.0,
            "kl_horizon": 10000,
            "forward_batch_size": 32,
        },
    },
}


def _merge(config: TrainConfig, values: dict[str, Any], source: str) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{source}: unknown settings {unknown}; known settings are {sorted(known)}"
        )
    ppo_values = dict(values.pop("ppo", None) or {})
    ppo_known = {f.name for f in dataclasses.fields(PPOConfig)}
    bad = sorted(set(ppo_values) - ppo_known)
    if bad:
        raise ValueError(f"{source}: unknown ppo settings {bad}; known are {sorted(ppo_known)}")
    ppo = dataclasses.replace(config.ppo, **ppo_values)
    return dataclasses.replace(config, **values, ppo=ppo)


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of settings")
    return data


def build_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    algorithm: str = "cory",
) -> TrainConfig:
    """Resolve defaults < preset < file < overrides into a validated config."""
    config = TrainConfig(algorithm=algorithm)
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets are {sorted(PRESETS)}")
        config = _merge(config, _deep_copy(PRESETS[preset]), f"preset {preset!r}")
    if config_file is not None:
        config = _merge(config, load_config_file(config_file), str(config_file))
    if overrides:
        config = _merge(config, dict(overrides), "command line")
    config.validate()
    return config


def _deep_copy(values: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(values))


def parse_args(
    argv: list[str] | None = None, algorithm: str = "cory"
) -> tuple[TrainConfig, Path | None]:
    """CLI: ``--preset``, ``--config``, ``--resume`` and one flag per setting.

    PPO settings are flags too (``--learning_rate 1e-5``). Values are read as YAML, so
    ``--max_new_tokens "[4, 16]"`` and ``--task_settings "{reward: vader}"`` work.
    """
    parser = argparse.ArgumentParser(description=f"Train with {algorithm.upper()} on cory_env")
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--config", help="YAML file of settings (e.g. a run's config.yaml)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    top = [f for f in dataclasses.fields(TrainConfig) if f.name not in ("ppo", "algorithm")]
    for f in top:
        parser.add_argument(f"--{f.name}", type=yaml.safe_load, default=argparse.SUPPRESS)
    for f in dataclasses.fields(PPOConfig):
        parser.add_argument(
            f"--{f.name}", type=yaml.safe_load, default=argparse.SUPPRESS, dest=f"ppo.{f.name}"
        )
    args = vars(parser.parse_args(argv))
    preset, config_file, resume = args.pop("preset"), args.pop("config"), args.pop("resume")
    overrides: dict[str, Any] = {}
    for key, value in args.items():
        if key.startswith("ppo."):
            overrides.setdefault("ppo", {})[key[4:]] = value
        else:
            overrides[key] = value
    if resume is not None:
        if preset or config_file:
            parser.error("--resume takes the run's saved config; drop --preset/--config")
        config_file = Path(resume) / "config.yaml"
        overrides["run_dir"] = str(resume)
    config = build_config(preset, config_file, overrides, algorithm=algorithm)
    if config.algorithm != algorithm:
        parser.error(f"this script trains {algorithm!r}; the config says {config.algorithm!r}")
    return config, Path(resume) if resume is not None else None
