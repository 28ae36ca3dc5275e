"""Build what a config describes: the accelerator, the seeded game and one learner per seat."""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from cory_env import BatchedTextGame, load_causal_lm, load_tokenizer, make_task, pad_token_id
from cory_env.checks import SettingError
from cory_env.models import ModelNotFound, model_problem, resolve
from cory_env.tasks import task_needs_tokenizer
from cory_rl.agents.base import Learner
from cory_rl.agents.engine import RolloutEngine, VLLMEngine, hf_weights, require_vllm
from cory_rl.agents.engine_server import ServerError, VLLMServerEngine
from cory_rl.agents.policy import ModelPool
from cory_rl.agents.registry import Seat, build_learner
from cory_rl.agents.sharding import Sharding
from cory_rl.train.config.train_config import TrainConfig
from cory_rl.train.core.distributed import Processes
from cory_rl.train.core.games import make_game, owners
from cory_rl.train.core.server_wait import wait_for_listener


def make_accelerator(config: TrainConfig) -> Any:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SettingError("device: 'cuda', but no CUDA device is visible; use cpu or auto")
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    warning = emulated_bf16_warning(config, use_cpu)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return Accelerator(cpu=use_cpu, mixed_precision=config.mixed_precision)


def emulated_bf16_warning(config: TrainConfig, use_cpu: bool) -> str | None:
    """What to say before a CPU run in bf16 where the CPU has no bfloat16 instructions."""
    if not use_cpu or config.mixed_precision != "bf16" or cpu_has_bf16():
        return None
    return (
        "warning: mixed_precision: bf16 on a CPU without bfloat16 instructions (torch sees "
        f"{torch.backends.cpu.get_cpu_capability()}): torch emulates them, and an update can "
        "take ten times as long as in fp32 (docs/benchmarks.md); mixed_precision no, the "
        "default, is faster here"
    )


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), as oneDNN reports."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the probe: assume it does
        return True


ONE_PROCESS_SHARDS_NOTHING = (
    "warning: sharding: FSDP2 in one process shards nothing (each of N processes holds 1/N "
    "of the weights; here N is 1): the run trains as with sharding none; shard with "
    "accelerate launch --config_file train/configs/fsdp2.yaml --num_processes N (docs/scale.md)"
)


def launched_with_fsdp() -> str | None:
    """The FSDP version an ``accelerate launch`` config asks for (its environment), or None."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    return os.environ.get("FSDP_VERSION", "1")


def make_sharding(config: TrainConfig, accelerator: Any) -> Sharding | None:
    """FSDP2 over the run's processes when the config (or the launch) asks for it."""
    launched = launched_with_fsdp()
    if launched is not None and launched != "2":
        raise SettingError(
            f"accelerate launch runs an FSDP{launched} config; this library shards with FSDP2: "
            "set fsdp_version: 2 in it (train/configs/fsdp2.yaml)"
        )
    if config.sharding == "none" and launched is not None:
        raise SettingError(
            "sharding: 'none', but accelerate launch runs an FSDP config; launch with "
            "train/configs/multi_gpu.yaml (or multi_cpu.yaml) for data-parallel training, "
            "or set sharding fsdp2"
        )
    wanted = config.sharding == "fsdp2" or (config.sharding == "auto" and launched is not None)
    if not wanted:
        return None
    if Processes(accelerator).num == 1:  # the same config may be meant for a launch later
        print(ONE_PROCESS_SHARDS_NOTHING, file=sys.stderr, flush=True)
        return None
    # Every process loads the whole weights (transformers would otherwise leave them empty
    # outside the main process, for FSDP1 to broadcast); the pool then shards them.
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    sharding = Sharding(accelerator.device, reshard_after_forward=reshard)
    if sharding.is_main:
        print(
            f"sharding: FSDP2 over {sharding.num_processes} processes, each holding its "
            "shard of every seat's weights, gradients and Adam moments (docs/scale.md)"
        )
    return sharding


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


def _model_setting(config: TrainConfig, agent: str) -> str:
    named = agent in (config.models or {})
    return f"models.{agent}" if named else f"model (seat {agent})"


def check_models(config: TrainConfig) -> dict[str, str]:
    """Every seat's model, refused in one line when it cannot load (a missing folder, a hub
    id offline), before any weight is read; returns the model of every seat."""
    seat_models = config.seat_models()
    for agent, model in seat_models.items():
        problem = model_problem(model)
        if problem is not None:
            raise SettingError(f"{_model_setting(config, agent)}: {problem}")
    for agent, reference in (config.references or {}).items():
        problem = model_problem(reference)
        if problem is not None:
            raise SettingError(f"references.{agent}: {problem}")
    config.model_references()  # one reference per model
    return seat_models


def build_game_and_learners(
    config: TrainConfig, accelerator: Any = None
) -> tuple[BatchedTextGame, dict[str, Learner]]:
    """The seeded game and one learner per seat, built from the registry.

    Seats of one base model share its frozen reference (``ModelPool``); every seat is
    tokenised with its own model's tokenizer.
    """
    seat_models = check_models(config)
    task = None
    if not task_needs_tokenizer(config.task):  # the user's data and reward: checked first
        task = make_task(config.task, **config.task_settings)
    set_seed(config.seed)
    accelerator = accelerator or make_accelerator(config)
    if config.rollout_engine != "none" and config.vllm_mode == "server":  # before the models
        wait_for_listener(server_url(config), config.vllm_server_timeout, say=_say(accelerator))
    tokenizers = {}
    for agent, model in seat_models.items():
        try:
            tokenizers[agent] = load_tokenizer(model)
        except ModelNotFound as err:
            raise SettingError(f"{_model_setting(config, agent)}: {err}") from None
    game = make_game(config, list(tokenizers.values()), task=task)
    adapters: dict[str, list[str]] = {}
    shared = config.shared_seats()  # they play their owner's policy: no adapter of their own
    for agent, model in seat_models.items():
        if agent not in shared:
            adapters.setdefault(model, []).append(agent)
    pool = ModelPool(
        partial(load_causal_lm, load_in_4bit=config.load_in_4bit),
        lora_config(config),
        activation_checkpointing=config.activation_checkpointing,
        references=config.model_references(),
        sharding=make_sharding(config, accelerator),
        adapters=adapters,
    )
    learners: dict[str, Learner] = {}
    for i, (agent, (name, settings)) in enumerate(config.seat_learners().items()):
        if agent in shared:  # one learner in several seats (it plays the owner's model)
            learners[agent] = learners[shared[agent]]
            continue
        seat = Seat(
            agent=agent,
            index=i,
            n_agents=config.game.n_agents,
            settings=settings,
            tokenizer=tokenizers[agent],
            vocab_size=int(game.action_space(agent).n),
            pad_token_id=pad_token_id(tokenizers[agent]),
            model=seat_models[agent],
            model_pool=pool,
            accelerator=accelerator,
            seed=Processes(accelerator).game_seed(config.seed) + 1000 * i,
            group_size=config.game.group_size,
            max_new_tokens=game.budget_high,
        )
        learners[agent] = build_learner(name, seat)
    for owner in set(shared.values()):
        learners[owner].seats = 1 + list(shared.values()).count(owner)
    pool.shard_references()
    if config.rollout_engine != "none":
        attach_engines(config, game, learners, seat_models, tokenizers)
    return game, learners


def attach_engines(
    config: TrainConfig,
    game: BatchedTextGame,
    learners: dict[str, Learner],
    seat_models: dict[str, str],
    tokenizers: dict[str, Any],
) -> None:
    """One vLLM engine per base model, shared by the LLM seats that play it: in this
    process (``vllm_mode: colocate``) or a server's (``server``)."""
    if config.vllm_mode == "colocate":
        try:
            require_vllm()
        except ImportError as err:
            raise SettingError(str(err)) from None
    engines: dict[str, RolloutEngine] = {}
    seats = {agent: resolve(seat_models[agent]) for agent in owners(learners)}
    for agent, learner in owners(learners).items():
        if not learner.takes_engine:
            continue  # not an LLM learner: it acts as it does
        model = seats[agent]
        if model not in engines and config.vllm_mode == "server":
            engines[model] = server_engine(config, model, seat_models[agent], game, learner)
        elif model not in engines:
            engines[model] = VLLMEngine(
                model,
                max_model_len=game.context_length + game.budget_high,
                dtype="bfloat16" if config.mixed_precision == "bf16" else "float32",
                seed=config.seed,
                lora_rank=config.lora_r if config.lora else None,
                seats=list(seats.values()).count(model),
            )
        learner.attach_engine(engines[model], tokenizers[agent].eos_token_id)


def server_url(config: TrainConfig) -> str:
    """The vLLM server's address: ``vllm_server_base_url``, else its host and port."""
    return config.vllm_server_base_url or (
        f"http://{config.vllm_server_host}:{config.vllm_server_port}"
    )


def _say(accelerator: Any) -> Any:
    """``print`` with a flush on the main process; None (silence) on the others."""
    return partial(print, flush=True) if Processes(accelerator).is_main else None


def server_engine(
    config: TrainConfig, model: str, name: str, game: BatchedTextGame, learner: Any
) -> VLLMServerEngine:
    """The engine of a running ``vllm serve`` of ``model`` (the folder ``name`` resolves
    to), its failures one line; one server serves one model."""
    models = set(config.seat_models().values())
    if len(models) > 1:
        raise SettingError(
            f"vllm_mode: 'server' serves one model; the seats play {sorted(models)}: give "
            "them one model, or use vllm_mode colocate"
        )
    processes = Processes(learner.accelerator)
    try:
        return VLLMServerEngine(
            server_url(config),
            model,
            max_model_len=game.context_length + game.budget_high,
            timeout=config.vllm_server_timeout,
            lora_rank=config.lora_r if config.lora else None,
            base_weights=partial(hf_weights, learner.model.lm),  # LoRA: the adapters' base
            aliases=[name],
            is_main=processes.is_main,
            share=processes.broadcast,
        )
    except ServerError as err:
        raise SettingError(f"vllm_mode server: {err}") from None
