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

from agents.ppo import PPOConfig
from cory_env import checks
from cory_env.core import GAME_SETTINGS
from cory_env.plugins import import_modules
from cory_env.tasks import check_task_settings
from cory_env.tasks.base import budget_range
from train.algorithms import ALGORITHMS, algorithm_defaults
from train.allocator import ALLOCATORS
from train.arguments import ArgumentParser

PPO_SETTINGS = tuple(f.name for f in dataclasses.fields(PPOConfig))


@dataclass
class TrainConfig:
    """Everything a run needs; the learners' hyper-parameters live in ``ppo``."""

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
    learners: dict[str, Any] | None = None
    """A learner per seat, e.g. ``{llm_0: ppo, llm_1: {learner: reinforce, learning_rate:
    1e-5}}``: every seat must be named. None = the algorithm's learner in every seat."""
    learner_settings: dict[str, Any] = field(default_factory=dict)
    """Settings of the seats' learners beyond PPO's (e.g. ``{reset_freq: 17}``), shared by
    every seat whose learner has them."""
    n_agents: int = 2
    lam: float = 1.0
    sees: str = "previous"
    """Who a later agent sees: ``previous`` (a chain), ``all``, or ``none`` (no transfer)."""
    group_size: int = 1
    """Each query is played this many times per batch (RLOO/GRPO groups)."""
    reward_norm: bool = False
    """Standardise each agent's scores over the batch before ``lam`` mixes them."""
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
    allocator: str = "auto"
    """Heap allocator of a script run (train/allocator.py): ``auto`` (mimalloc where the
    cmeel-mimalloc package is installed), ``mimalloc`` or ``system`` (glibc's)."""
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
    ppo: PPOConfig = field(default_factory=PPOConfig)

    @property
    def agents(self) -> list[str]:
        return [f"llm_{i}" for i in range(self.n_agents)]

    def seat_models(self) -> dict[str, str]:
        """The model of every seat."""
        return {agent: (self.models or {}).get(agent, self.model) for agent in self.agents}

    def seat_learners(self) -> dict[str, tuple[str, Any]]:
        """Every seat's learner name and validated hyper-parameters (no model is loaded)."""
        from agents.registry import learner_settings

        default = ALGORITHMS[self.algorithm].learner
        shared = {**dataclasses.asdict(self.ppo), **self.learner_settings}
        seats = {}
        for agent in self.agents:
            entry = default if self.learners is None else self.learners[agent]
            own = dict(entry) if isinstance(entry, dict) else {"learner": entry}
            if "learner" not in own:
                raise checks.SettingError(
                    f"learners: {agent}: the 'learner:' key is missing (it has {sorted(own)}); "
                    f"e.g. {{{agent}: {{learner: reinforce, learning_rate: 1e-4}}}}"
                )
            name = own.pop("learner")
            try:
                seats[agent] = (name, learner_settings(name, shared, own))
            except (checks.SettingError, TypeError) as err:
                raise checks.SettingError(f"learners: {agent}: {err}") from None
        return seats

    def validate(self) -> None:
        """Check every setting's type and range now, before any model is loaded."""
        checks.choice(self.algorithm, "algorithm", sorted(ALGORITHMS))
        algo = ALGORITHMS[self.algorithm]
        seats = (f"{algo.min_agents}..{algo.max_agents} seats" if algo.max_agents > 1
                 else "1 seat: it is a single-agent baseline; several seats play --algorithm "
                 "cory (or moe), with --learners to choose each seat's learner")  # fmt: skip
        self.n_agents = checks.integer(
            self.n_agents, "n_agents", minimum=algo.min_agents, maximum=algo.max_agents,
            hint=f"algorithm {self.algorithm!r} plays {seats}",
        )  # fmt: skip
        checks.choice(self.sees, "sees", ("previous", "all", "none"))
        self.group_size = checks.integer(self.group_size, "group_size", minimum=1)
        checks.boolean(self.reward_norm, "reward_norm")
        for name in ("models", "learners"):
            mapping = getattr(self, name)
            if mapping is None:
                continue
            if not isinstance(mapping, dict):
                raise checks.fail(name, "a mapping from seat to value, e.g. {llm_0: ...}", mapping)
            unknown = sorted(set(mapping) - set(self.agents))
            if unknown:
                raise checks.SettingError(
                    f"{name}: no seats {unknown} in a {self.n_agents}-agent game; the seats "
                    f"are {self.agents}"
                )
        if self.learners is not None:
            missing = [a for a in self.agents if a not in self.learners]
            if missing:
                raise checks.SettingError(
                    f"learners: seats {missing} have no learner; name one for every seat of "
                    f"{self.agents}, or drop --learners to use the algorithm's"
                )
        for agent, model in (self.models or {}).items():
            checks.text(model, f"models.{agent}")
        if not isinstance(self.learner_settings, dict):
            raise checks.fail("learner_settings", "a mapping", self.learner_settings)
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
        self.lam = checks.number(self.lam, "lam", hint="1 = CORY, 0 = independent, -1 = zero-sum")
        self.eta = checks.number(self.eta, "eta", minimum=0)
        for name in (
            "role_exchange_period",
            "batch_size",
            "iterations",
            "sample_every",
            "checkpoint_every",
            "lora_r",
        ):
            setattr(self, name, checks.integer(getattr(self, name), name, minimum=1))
        self.n_samples = checks.integer(self.n_samples, "n_samples", minimum=0)
        if not isinstance(self.imports, list) or not all(
            isinstance(m, str) and m for m in self.imports
        ):
            raise checks.fail("imports", "a list of module names", self.imports)
        self.eval_every = checks.integer(self.eval_every, "eval_every", minimum=0, hint="0 = off")
        for name in ("eval_samples", "eval_batch_size"):
            setattr(self, name, checks.integer(getattr(self, name), name, minimum=1))
        self.eval_seed = checks.integer(self.eval_seed, "eval_seed", minimum=0)
        if self.eval_queries is not None:
            self.eval_queries = checks.integer(self.eval_queries, "eval_queries", minimum=1)
        self.seed = checks.integer(self.seed, "seed", minimum=0)
        self.lora_alpha = checks.number(
            self.lora_alpha, "lora_alpha", minimum=0, exclusive_min=True
        )
        if self.max_new_tokens is not None:
            try:
                budget_range(self.max_new_tokens)
            except ValueError as err:
                raise checks.SettingError(str(err)) from None
            if isinstance(self.max_new_tokens, tuple):
                self.max_new_tokens = list(self.max_new_tokens)
        if self.context_length is not None:
            self.context_length = checks.integer(self.context_length, "context_length", minimum=2)
        checks.choice(self.device, "device", ("auto", "cpu", "cuda"))
        checks.choice(self.mixed_precision, "mixed_precision", ("no", "bf16"))
        checks.choice(self.allocator, "allocator", ALLOCATORS)
        checks.boolean(self.activation_checkpointing, "activation_checkpointing")
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
            self.run_dir = checks.text(
                str(self.run_dir) if isinstance(self.run_dir, Path) else self.run_dir, "run_dir"
            )
        if not isinstance(self.ppo, PPOConfig):
            raise checks.fail("ppo", "a mapping of PPO settings", self.ppo)
        self.ppo.validate()
        if self.batch_size % self.ppo.mini_batch_size:
            raise checks.SettingError(
                f"batch_size ({self.batch_size}) must be a multiple of ppo.mini_batch_size "
                f"({self.ppo.mini_batch_size})"
            )
        if self.batch_size % self.group_size:
            raise checks.SettingError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size "
                f"({self.group_size})"
            )
        seats = self.seat_learners()
        used = {f for _, settings in seats.values() if settings is not None
                for f in (x.name for x in dataclasses.fields(settings))}  # fmt: skip
        unused = sorted(set(self.learner_settings) - used)
        if unused:
            raise checks.SettingError(
                f"learner_settings {unused} belong to no seat's learner "
                f"({sorted({name for name, _ in seats.values()})})"
            )
        from agents.registry import learner_spec

        for agent, (name, _) in seats.items():
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
        "ppo": {
            "mini_batch_size": 8,
            "ppo_epochs": 2,
            "learning_rate": 1e-5,
            "init_kl_coef": 0.3,
            "score_scaling": True,
            "score_norm": True,
            "repetition_penalty": 1.0,
        },
    },
    # The embedded model on 2 CPU cores, long enough to show learning.
    "cpu": {
        "batch_size": 32,
        "iterations": 60,
        "max_new_tokens": [4, 12],
        "sample_every": 5,
        "checkpoint_every": 10,
        # Score scaling on and no repetition penalty for PPO and CORY alike, as the README's
        # cpu results were run (the algorithms' official defaults differ; see algorithms.py).
        "ppo": {
            "mini_batch_size": 16,
            "ppo_epochs": 4,
            "learning_rate": 2e-5,
            "init_kl_coef": 0.1,
            "score_scaling": True,
            "score_norm": True,
            "repetition_penalty": 1.0,
        },
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
            "kl_target": 6.0,
            "kl_horizon": 10000,
            "forward_batch_size": 32,
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
        "ppo": {
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
    "paper-gsm8k": {"cory": {"ppo": {"learning_rate": 1e-4}}},
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


def _merge(config: TrainConfig, values: dict[str, Any], source: str) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise checks.SettingError(
            f"{source}: unknown settings {unknown}; known settings are {sorted(known)}"
        )
    ppo_values = values.pop("ppo", None) or {}
    if not isinstance(ppo_values, dict):
        raise checks.fail("ppo", "a mapping of PPO settings", ppo_values, source)
    bad = sorted(set(ppo_values) - set(PPO_SETTINGS))
    if bad:
        raise checks.SettingError(
            f"{source}: unknown ppo settings {bad}; known are {sorted(PPO_SETTINGS)}"
        )
    ppo = dataclasses.replace(config.ppo, **ppo_values)
    return dataclasses.replace(config, **values, ppo=ppo)


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
    config = _merge(TrainConfig(algorithm=algorithm), algorithm_defaults(algorithm),
                    f"algorithm {algorithm!r}")  # fmt: skip
    if preset is not None:
        if preset not in PRESETS:
            raise checks.SettingError(f"unknown preset {preset!r}; presets are {sorted(PRESETS)}")
        config = _merge(config, copy.deepcopy(PRESETS[preset]), f"preset {preset!r}")
        for_algorithm = PRESET_ALGORITHM_SETTINGS.get(preset, {}).get(algorithm)
        if for_algorithm:
            where = f"preset {preset!r} for {algorithm!r}"
            config = _merge(config, copy.deepcopy(for_algorithm), where)
    if config_file is not None:
        config = _merge(config, file_values, f"config file {config_file}")
    if overrides:
        config = _merge(config, overrides, "command line")
    import_user_modules(config.imports)
    config.validate()
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
    for f in dataclasses.fields(TrainConfig):
        if f.name not in ("ppo", "algorithm"):
            parser.add_argument(f"--{f.name}", type=_flag_value, default=argparse.SUPPRESS)
    for name in PPO_SETTINGS:
        parser.add_argument(
            f"--{name}", type=_flag_value, default=argparse.SUPPRESS, dest=f"ppo.{name}"
        )
    return parser


def parse_args(
    argv: list[str] | None = None, algorithm: str = "cory"
) -> tuple[TrainConfig, Path | None]:
    """CLI: ``--preset``, ``--config``, ``--resume`` and one flag per setting.

    PPO settings are flags too (``--learning_rate 1e-5``). Values are read as YAML, so
    ``--max_new_tokens "[4, 16]"`` and ``--task_settings "{reward: vader}"`` work. A bad
    value or setting exits with one line that names it.
    """
    parser = make_parser(algorithm)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = vars(parser.parse_args(_join_negative_values(argv)))
    preset, config_file, resume = args.pop("preset"), args.pop("config"), args.pop("resume")
    modules = args.pop("import_modules")
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
