"""Checks of a run's settings, before any model loads: each function one group of
``TrainConfig``'s settings and how they fit together (``TrainConfig.validate`` runs them
all). The game and the tasks check their own; each seat's learner config checks its own."""

from __future__ import annotations

from typing import Any

from cory_env import checks
from cory_env.core import GAME_SETTINGS, GameSettings
from cory_env.tasks import check_task_settings
from cory_rl.agents.registry import learner_spec
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.allocator import ALLOCATORS
from cory_rl.train.config.tracker_checks import check_report_to


def check_seats(config: Any) -> None:
    """The algorithm, the game and its seats: models, references and learners per seat."""
    checks.choice(config.algorithm, "algorithm", sorted(ALGORITHMS))
    algo = ALGORITHMS[config.algorithm]
    if not isinstance(config.game, GameSettings):
        raise checks.fail("game", "a mapping of game settings", config.game)
    try:
        config.game.validate()
    except checks.SettingError as err:
        raise checks.SettingError(str(err).removeprefix("game: ")) from None
    seats = (
        f"{algo.min_agents}..{algo.max_agents} seats"
        if algo.max_agents > 1
        else "1 seat: it is a single-agent baseline; several seats play --algorithm "
        "cory (or moe), with --learners to choose each seat's learner"
    )
    checks.integer(
        config.game.n_agents,
        "n_agents",
        minimum=algo.min_agents,
        maximum=algo.max_agents,
        hint=f"algorithm {config.algorithm!r} plays {seats}",
    )
    for name in ("models", "references", "learners"):
        mapping = getattr(config, name)
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise checks.fail(name, "a mapping from seat to value, e.g. {llm_0: ...}", mapping)
        unknown = sorted(set(mapping) - set(config.agents))
        if unknown:
            raise checks.SettingError(
                f"{name}: no seats {unknown} in a {config.game.n_agents}-agent game; the seats "
                f"are {config.agents}"
            )
    if config.learners is not None:
        missing = [a for a in config.agents if a not in config.learners]
        if missing:
            raise checks.SettingError(
                f"learners: seats {missing} have no learner; name one for every seat of "
                f"{config.agents}, or drop --learners to use the algorithm's"
            )
        config.check_shared_seats()


def check_models(config: Any) -> None:
    """The seats' models and references, and LoRA beside them."""
    for name in ("models", "references"):
        for agent, model in (getattr(config, name) or {}).items():
            checks.text(model, f"{name}.{agent}")
    if config.references and config.lora:
        raise checks.SettingError(
            "references: a reference other than the seat's model needs full fine-tuning "
            "(with lora the reference is the shared base); set lora false or drop references"
        )


def check_task(config: Any) -> None:
    """The task and its settings (the task checks its own)."""
    checks.text(config.task, "task")
    checks.text(config.model, "model", hint="a hub id, a local folder, or 'embedded'")
    if not isinstance(config.task_settings, dict):
        raise checks.fail(
            "task_settings", "a mapping such as {reward: vader}", config.task_settings
        )
    game_keys = sorted(set(config.task_settings) & set(GAME_SETTINGS))
    if game_keys:
        raise checks.SettingError(
            f"task_settings: {game_keys} are settings of the game, not of the task; give "
            f"them as --{game_keys[0]} ..."
        )
    check_task_settings(config.task, config.task_settings)


def check_run(config: Any) -> None:
    """How long and how often: batches, iterations, samples, evaluations, the health band
    and the imports."""
    checks.number(config.eta, "eta", minimum=0)
    checks.number(config.health_approx_kl, "health_approx_kl", minimum=0, exclusive_min=True)
    checks.number(
        config.health_clipfrac,
        "health_clipfrac",
        minimum=0,
        maximum=1,
        exclusive_min=True,
        hint="a fraction of tokens",
    )
    for name in (
        "batch_size",
        "iterations",
        "sample_every",
        "checkpoint_every",
        "lora_r",
        "eval_samples",
        "eval_batch_size",
    ):
        checks.integer(getattr(config, name), name, minimum=1)
    checks.integer(config.n_samples, "n_samples", minimum=0)
    if not isinstance(config.imports, list) or not all(
        isinstance(m, str) and m for m in config.imports
    ):
        raise checks.fail("imports", "a list of module names", config.imports)
    checks.integer(config.eval_every, "eval_every", minimum=0, hint="0 = off")
    checks.integer(config.eval_seed, "eval_seed", minimum=0)


def check_stopping(config: Any) -> None:
    """Early stopping and the evaluations it watches."""
    checks.text(
        config.early_stopping_metric,
        "early_stopping_metric",
        hint="<role or all>/<number>, e.g. pioneer/reward",
    )
    if config.early_stopping_target is not None:
        checks.number(config.early_stopping_target, "early_stopping_target")
    if config.early_stopping_patience is not None:
        checks.integer(config.early_stopping_patience, "early_stopping_patience", minimum=1)
    checks.number(config.early_stopping_threshold, "early_stopping_threshold", minimum=0)
    checks.integer(config.early_stopping_min_updates, "early_stopping_min_updates", minimum=0)
    stopping = config.early_stopping_target is not None or config.early_stopping_patience
    if stopping and not config.eval_every:
        raise checks.SettingError(
            "early_stopping_target / early_stopping_patience watch the evaluations along "
            "training, and eval_every is 0: set eval_every (e.g. 10), or drop them"
        )
    if config.eval_queries is not None:
        checks.integer(config.eval_queries, "eval_queries", minimum=1)


def check_setup(config: Any) -> None:
    """The seed, device, precision, sharding, engine, LoRA, trackers and batch splits."""
    checks.integer(config.seed, "seed", minimum=0)
    checks.number(config.lora_alpha, "lora_alpha", minimum=0, exclusive_min=True)
    checks.choice(config.device, "device", ("auto", "cpu", "cuda"))
    checks.choice(config.mixed_precision, "mixed_precision", ("no", "bf16"))
    checks.choice(config.sharding, "sharding", ("auto", "none", "fsdp2"))
    check_rollout_engine(config)
    checks.choice(config.allocator, "allocator", ALLOCATORS)
    checks.boolean(config.activation_checkpointing, "activation_checkpointing")
    checks.boolean(config.restart_on_exchange, "restart_on_exchange")
    if config.restart_on_exchange and config.game.n_agents < 2:
        raise checks.SettingError(
            f"restart_on_exchange restarts the learners when the seats exchange roles, and "
            f"a {config.game.n_agents}-agent game never exchanges; set it false, or play "
            "n_agents 2 or more"
        )
    checks.boolean(config.lora, "lora")
    checks.boolean(config.load_in_4bit, "load_in_4bit")
    if config.load_in_4bit and (not config.lora or config.device == "cpu"):
        raise checks.SettingError(
            "load_in_4bit trains LoRA adapters on frozen 4-bit weights on a CUDA GPU: it "
            f"needs lora true and a device other than cpu (got lora={config.lora}, "
            f"device={config.device!r}); or set load_in_4bit false"
        )
    targets = config.lora_target_modules
    if not (isinstance(targets, str) and targets) and not (
        isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
    ):
        raise checks.fail("lora_target_modules", "'all-linear' or a list of module names", targets)
    if config.run_dir is not None:
        checks.text(config.run_dir, "run_dir")
    check_report_to(config.report_to)
    if config.batch_size % config.game.group_size:
        raise checks.SettingError(
            f"batch_size ({config.batch_size}) must be a multiple of group_size "
            f"({config.game.group_size})"
        )
    check_learners(config)


def check_rollout_engine(config: Any) -> None:
    """The rollout engine's settings: the engine, and where a server of it is."""
    checks.choice(config.rollout_engine, "rollout_engine", ("none", "vllm"))
    checks.choice(config.vllm_mode, "vllm_mode", ("colocate", "server"))
    if config.vllm_mode == "server" and config.rollout_engine != "vllm":
        raise checks.SettingError(
            "vllm_mode: 'server' takes effect with rollout_engine vllm; add "
            "--rollout_engine vllm, or drop vllm_mode"
        )
    url = config.vllm_server_base_url
    if url is not None and not str(url).startswith(("http://", "https://")):
        raise checks.fail("vllm_server_base_url", "a URL such as http://host:8000", url)
    checks.text(config.vllm_server_host, "vllm_server_host")
    checks.integer(config.vllm_server_port, "vllm_server_port", minimum=1, maximum=65535)
    checks.number(
        config.vllm_server_timeout,
        "vllm_server_timeout",
        minimum=0,
        exclusive_min=True,
        hint="seconds",
    )


def check_learners(config: Any) -> None:
    """Every seat's learner and settings: each learner's config checks its own fields;
    here, that every ``learner`` setting belongs to some seat's learner, that a batch
    splits into mini-batches, and each learner's check of the game (group sizes)."""
    if not isinstance(config.learner, dict):
        raise checks.fail("learner", "a mapping of learner settings", config.learner)
    seats = config.seat_learners()
    known = config.learner_fields()
    unused = sorted(set(config.learner) - known)
    if unused:
        names = sorted({name for name, _ in seats.values()})
        raise checks.SettingError(
            f"learner: {unused} are settings of no seat's learner ({', '.join(names)}); "
            f"their settings are {sorted(known)}"
        )
    for agent, (name, settings) in seats.items():
        mini = getattr(settings, "mini_batch_size", None)
        if mini is not None and config.batch_size % mini:
            raise checks.SettingError(
                f"batch_size ({config.batch_size}) must be a multiple of mini_batch_size "
                f"({mini}{'' if len(seats) == 1 else f', {agent}'})"
            )
        check = learner_spec(name).check
        if check is not None:
            try:
                check(config)
            except checks.SettingError as err:
                raise checks.SettingError(f"learners: {agent} plays {name!r}: {err}") from None
