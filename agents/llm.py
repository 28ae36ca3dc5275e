"""The base of every LLM learner: its settings, its turns and rollouts, and the helpers of
an update. A learner built on it supplies ``learn`` (its advantages and its loss, stepped
by :func:`agents.update.minibatch_update`) and its own settings. Its other jobs have files
of their own: acting (``llm_acting.py``), a rollout engine (``llm_engine_seat.py``), the
reference, KL control and score scaling (``llm_reference.py``), save, load and export
(``llm_state.py``).

Acting goes token by token with a KV cache, recording each sampled token's log-prob and
the value as it goes, so a rollout costs no more than ``generate()``. The model plumbing
(value head, reference, LoRA sharing) is in ``agents/policy.py``; the RL math, each term
checked against hand-computed values, in ``agents/ppo_math.py`` and ``agents/pg_math.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.base import Learner
from cory_rl.agents.engine import RolloutEngine
from cory_rl.agents.llm_acting import Acting
from cory_rl.agents.llm_engine_seat import EngineSeat
from cory_rl.agents.llm_reference import ReferenceAndKL
from cory_rl.agents.llm_state import SavedState
from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.rollout import (
    Rollout,
    Turn,
    without_shared_padding,
)
from cory_rl.agents.sampling import SamplingDistribution, seen_before_each
from cory_rl.agents.sharding import full_tensor
from cory_rl.agents.speedups import StepInBackward, make_adam


@dataclass
class LLMConfig:
    """Settings every LLM learner shares: sampling, the KL penalty and its controller, score
    scaling and the optimiser's batches (defaults: CORY's IMDB settings)."""

    learning_rate: float = 1.41e-5
    """Adam's learning rate."""
    mini_batch_size: int = 16
    """Answers per optimiser step."""
    gradient_accumulation_steps: int = 1
    """Micro-batches a mini-batch is accumulated from."""
    forward_batch_size: int = 16
    """Rows per forward pass, of the reference and of the policy in the update: a larger
    micro-batch is computed in chunks whose gradients add up to its own exactly. A
    memory and speed setting only."""
    max_grad_norm: float | None = None
    """Clip each optimiser step's gradients to this total norm; None = no clipping (then,
    where nothing accumulates, Adam steps inside the backward pass: ``agents/update.py``)."""
    target_kl: float | None = None
    """Stop an update's epochs at the first mini-batch whose ``approx_kl`` (per token, to
    the acting policy) exceeds 1.5x this; None = take every step (``agents/update.py``)."""
    kl_estimator: str = "full"
    """``full``: exact full-vocabulary KL; or a sampled estimator: k1, k3, abs, mse."""
    adaptive_kl: bool = True
    """Adapt the KL coefficient to hold the KL to the reference near ``kl_target`` (Ziegler
    et al. 2019, TRL 0.7's controller); false keeps ``init_kl_coef`` fixed."""
    init_kl_coef: float = 0.3
    """The coefficient of the penalty on the KL to the frozen reference (GRPO's and RLOO's
    ``beta``), its starting value under ``adaptive_kl``; 0 with a fixed coefficient skips
    the reference pass."""
    kl_target: float = 6.0
    """With ``adaptive_kl``: the KL to the reference (summed over an answer's tokens,
    averaged over the batch) the controller steers towards."""
    kl_horizon: int = 10000
    """With ``adaptive_kl``: the controller's horizon in answers; an update moves the
    coefficient by at most a factor of 1 +- 0.2 x (answers in the batch) / this."""
    whiten_advantages: bool = True
    """Standardise the advantages over the batch (PPO and RLOO: mean 0, std 1; REINFORCE:
    divided by their std only); GRPO scales its own (``scale_rewards``)."""
    score_scaling: bool = True
    """Divide the rewards the game paid by their running std before learning (TRL 0.7's
    ``use_score_scaling``)."""
    score_norm: bool = True
    """With ``score_scaling``: also subtract the rewards' running mean (TRL 0.7's
    ``use_score_norm``); without it, no effect."""
    score_clip: float | None = None
    """Clamp the (scaled) rewards to [-score_clip, score_clip], with or without scaling;
    None = no clamp (TRL 0.7's ``score_clip``)."""
    temperature: float = 1.0
    """Sampling temperature: the logits are divided by it before sampling (1 = the model's
    own distribution)."""
    top_k: int = 0
    """Sample from the this many likeliest tokens only; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the fewest likeliest tokens whose probability reaches
    this; 1 = off."""
    repetition_penalty: float = 1.0
    """Sampling penalty on tokens already in the context (the official scripts: 1.1)."""
    engine_correction: bool = True
    """Weight each token a rollout engine sampled by the truncated importance ratio of the
    learner's log-prob to the engine's (``agents/engine_correction.py``; TRL's
    ``vllm_importance_sampling_correction``). Named after the engine, not TRL's
    ``importance_sampling``, which here is GRPO's ``importance_sampling_level`` (GSPO's
    ratio). Without an engine nothing is weighted, whatever this says."""
    engine_correction_mode: str = "token_truncate"
    """``token_truncate`` (TIS, the ratio clipped per token), ``token_mask``,
    ``sequence_truncate`` or ``sequence_mask`` (TRL's ``vllm_importance_sampling_mode``;
    its field defaults to ``sequence_mask``, its documentation names ``token_truncate``)."""
    engine_correction_cap: float | None = 3.0
    """The largest ratio kept (truncated to it, or masked above it); TRL's ``clip_max``."""
    engine_correction_floor: float | None = None
    """The smallest ratio kept (raised to it, or masked below it); TRL's ``clip_min``."""

    where = "learner"
    """How error messages name these settings."""

    def __post_init__(self) -> None:
        checks.plain_numbers(self)

    def validate(self) -> None:
        """Check every setting's type and range; nothing is changed."""
        w = self.where
        positive = {"minimum": 0, "exclusive_min": True, "where": w}
        for name in ("learning_rate", "kl_target", "temperature"):
            checks.number(getattr(self, name), name, **positive)
        checks.number(self.init_kl_coef, "init_kl_coef", minimum=0, where=w)
        checks.number(self.top_p, "top_p", minimum=0, maximum=1, exclusive_min=True, where=w)
        checks.number(self.repetition_penalty, "repetition_penalty", hint="1 = off", **positive)
        if self.max_grad_norm is not None:
            checks.number(self.max_grad_norm, "max_grad_norm", **positive,
                          hint="a negative norm would reverse the gradients")  # fmt: skip
        if self.score_clip is not None:
            checks.number(self.score_clip, "score_clip", **positive)
        if self.target_kl is not None:
            checks.number(self.target_kl, "target_kl", **positive,
                          hint="per-token approx_kl, typically 0.01-0.05")  # fmt: skip
        for name in ("mini_batch_size", "gradient_accumulation_steps", "forward_batch_size",
                     "kl_horizon"):  # fmt: skip
            checks.integer(getattr(self, name), name, minimum=1, where=w)
        checks.integer(self.top_k, "top_k", minimum=0, where=w, hint="0 = off")
        for name in ("adaptive_kl", "whiten_advantages", "score_scaling", "score_norm"):
            checks.boolean(getattr(self, name), name, where=w)
        checks.choice(self.kl_estimator, "kl_estimator", ("full", *pm.KL_ESTIMATORS), where=w)
        checks.boolean(self.engine_correction, "engine_correction", where=w)
        checks.choice(self.engine_correction_mode, "engine_correction_mode", ec.MODES, where=w)
        cap, floor = self.engine_correction_cap, self.engine_correction_floor
        if cap is not None:
            checks.number(cap, "engine_correction_cap", **positive, hint="TRL's default: 3")
        if floor is not None:
            checks.number(floor, "engine_correction_floor", minimum=0, maximum=cap, where=w)
        if cap is None and floor is None:
            raise checks.SettingError(
                f"{w}: engine_correction_cap and engine_correction_floor are both None: an "
                "untruncated ratio can blow an update up; set engine_correction_cap (e.g. 3) "
                "or engine_correction false"
            )
        if self.mini_batch_size % self.gradient_accumulation_steps:
            raise checks.SettingError(
                f"{w}: mini_batch_size ({self.mini_batch_size}) must be a multiple of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps})"
            )


# ----------------------------------------------------------------------------- learner
class Probe:
    """Watches an LLM learner work; by default it does nothing.

    Each piece of work runs inside ``probe.phase(name, learner, **info)``: ``act`` (one
    token per game; ``obs``), ``end_rollout`` (``obs``; the turn is still
    ``learner.turn``), ``reference`` (the whole reference pass) and ``reference_forward``
    (one chunk of it; ``inputs`` = ids, mask, positions and ``keep``), and in the update
    ``forward`` (``inputs``, ``keep``), ``backward`` and ``optimiser`` (the plain step). The
    benchmark (``bench/bench_train.py``) times and counts them by setting
    ``learner.probe``, so that nothing is patched.
    """

    @contextlib.contextmanager
    def phase(self, name: str, learner: LLMLearner, **info: Any) -> Iterator[None]:
        yield


class LLMLearner(Acting, EngineSeat, ReferenceAndKL, SavedState, Learner):
    """An LLM playing one seat (a :class:`agents.base.Learner`); subclasses add ``learn``.

    ``has_critic = False`` freezes the value head: acting still computes it and checkpoints
    keep it, but no loss uses it, so it never moves. Without LoRA it is also out of the
    optimiser; with LoRA ``PolicyWithValue.trainable_parameters`` lists it regardless, and
    it sits there with no gradient, so Adam neither keeps state for it nor updates it.
    """

    name = "llm"
    """The registered name, written into the agent's checkpoint."""
    has_critic = True
    can_restart = True
    takes_engine = True

    def __init__(
        self,
        policy: PolicyWithValue,
        reference: Reference,
        config: LLMConfig,
        pad_token_id: int,
        accelerator: Any = None,
        seed: int = 0,
    ) -> None:
        from accelerate import Accelerator

        config.validate()
        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.device = self.accelerator.device
        self.pad_token_id = pad_token_id
        if not self.has_critic:
            policy.value_head.requires_grad_(False)
        policy.to(self.device).eval()  # dropout stays off: the PPO ratio compares one function
        if not reference.adapters_disabled:
            reference.lm.to(self.device)
        self.reference = reference
        self.sharding = policy.sharding
        """FSDP2 (``agents/sharding.py``): the pool sharded the policy; None = whole."""
        optimizer = make_adam(policy.trainable_parameters(), config.learning_rate)
        if self.sharding is None:
            if self.accelerator.num_processes > 1:  # DDP reduces dense gradients only
                for module in policy.modules():
                    if isinstance(module, torch.nn.Embedding):
                        module.sparse = False
            self.policy, self.optimizer = self.accelerator.prepare(policy, optimizer)
        else:  # sharded already: DDP must not wrap it, and FSDP2 reduces the gradients
            self.policy, self.optimizer = policy, optimizer
        self.gathered = False
        """Whether the policy's full weights are held for a turn (:meth:`turn_over`)."""
        self.step_in_backward = StepInBackward(self.optimizer, policy.trainable_parameters())
        self.kl_ctl, self.score_moments = self._fresh_kl_and_scores()
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.shuffle_generator = torch.Generator().manual_seed(seed + 1)
        self.sampling = SamplingDistribution(
            config.temperature, config.top_k, config.top_p, config.repetition_penalty
        )
        self.rollout: Rollout | None = None
        self.turn: Turn | None = None
        """The turn being played (None between turns); read by the benchmark."""
        self.sampling_noise: np.ndarray | None = None
        """Common random numbers (:meth:`use_sampling_noise`); None = the own generator."""
        self.probe = Probe()
        self.engine: RolloutEngine | None = None
        """Where whole turns come from (``agents/engine.py``); None = acting token by token."""
        self.eos_token_id: int | None = None
        self.weights_version = 0
        """Counts changes of the weights (updates, loads, resets); an engine reloads them
        when it differs from the version it holds."""
        self.engine_gaps: list[torch.Tensor] = []
        self.correction_stats: dict[str, float] = {}

    @property
    def model(self) -> PolicyWithValue:
        return self.accelerator.unwrap_model(self.policy)

    def learn(self) -> dict[str, float]:
        """One update on the rollout collected since the last call (the learner's own)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    def gather_for_turn(self) -> None:
        """Sharded: hold the full weights from the turn's first forward to its end, so that
        the turn's forwards, as many as its longest answer, make no collective call."""
        if self.sharding is not None and not self.gathered:
            self.sharding.gather(self.model.sharded_modules())
            self.gathered = True

    def turn_over(self) -> None:
        """The game moved on from this seat's turn: free the weights gathered for it."""
        if self.gathered:
            self.sharding.release(self.model.sharded_modules())
            self.gathered = False

    def clip_gradients(self, max_norm: float) -> float:
        """Clip the trainable parameters' gradients to ``max_norm``; their norm before."""
        params = self.model.trainable_parameters()
        if self.sharding is None:
            return float(self.accelerator.clip_grad_norm_(params, max_norm))
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(full_tensor(norm))

    def _close_turn(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> Rollout:
        """The turn as a rollout: the tokens the game accepted and the rewards it paid."""
        turn = self.turn
        if turn is None or not turn.tokens:
            raise RuntimeError("end_rollout() without a turn: act() was never called this game")
        accepted = torch.as_tensor(np.asarray(obs["num_generated"]), dtype=torch.long)
        mask = (torch.arange(len(turn.tokens))[None, :] < accepted[:, None]).long()
        tokens = torch.stack(turn.tokens, dim=1)
        return Rollout(
            prompt_ids=turn.prompt_ids,
            prompt_mask=turn.prompt_mask,
            tokens=torch.where(mask.bool(), tokens, self.pad_token_id),
            mask=mask,
            logprobs=torch.stack(turn.logprobs, dim=1) * mask,
            sample_logprobs=torch.stack(turn.sample_logprobs, dim=1) * mask,
            values=torch.stack(turn.values, dim=1) * mask,
            full_logprobs=torch.stack(turn.full_logprobs, dim=1) if turn.full_logprobs else None,
            rewards=torch.as_tensor(np.asarray(rewards), dtype=torch.float32),
            engine_logprobs=self._engine_logprobs(turn, mask),
        )

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        """Keep the finished turn for :meth:`learn`."""
        with self.probe.phase("end_rollout", self, obs=obs):
            self.rollout = self._close_turn(obs, rewards)
        self.turn = None

    def discard_turn(self) -> None:
        """Let the finished turn go and keep the rollout already collected (a batch the
        loop played for another seat's dynamic sampling)."""
        self.turn = None

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Summed KL to the reference, summed log-prob, mean entropy and final value per game."""
        if self.turn is None or not self.turn.tokens:
            return {}
        rollout = self._close_turn(obs, np.zeros(len(obs["num_generated"])))
        mask = rollout.mask.float()
        lengths = mask.sum(dim=1)
        last = (lengths.long() - 1).clamp(min=0)[:, None]
        if rollout.full_logprobs is not None:
            entropy = pm.entropy_from_logits(rollout.full_logprobs)
        else:
            entropy = torch.stack(self.turn.entropies, dim=1)
        exact = "full" if rollout.full_logprobs is not None else None
        return {
            "kl": self.reference_pass(rollout, exact)[0].sum(dim=1).numpy(),
            "logprob": rollout.logprobs.sum(dim=1).numpy(),
            "entropy": ((entropy * mask).sum(dim=1) / lengths.clamp(min=1)).numpy(),
            "value": rollout.values.gather(1, last).squeeze(1).numpy(),
            "length": lengths.numpy(),
        }

    def take_rollout(self) -> Rollout:
        """The rollout collected since the last :meth:`learn` (then forgotten)."""
        if self.rollout is None:
            raise RuntimeError("learn() before any end_rollout(): nothing was collected")
        rollout, self.rollout = self.rollout, None
        rollout.is_weights = self.correction_weights(rollout)
        return rollout

    def finish(
        self, rollout: Rollout, kl: torch.Tensor, kl_coef: float, scores: torch.Tensor
    ) -> dict[str, float]:
        """Update the KL controller from the batch's mean summed KL (over every process);
        return the statistics every LLM learner reports (the loop's ``kl`` is
        ``objective/kl``)."""
        seq_kl = kl.sum(dim=1)
        B = len(rollout.rewards)
        measured = {}
        if self.needs_reference_pass:  # else no KL was measured: none is reported
            self.kl_ctl.update(self.mean_over_processes(seq_kl), B * self.accelerator.num_processes)
            measured = {"objective/kl": float(seq_kl.mean())}
        return {
            "env/reward_mean": float(rollout.rewards.mean()),
            "env/reward_std": float(rollout.rewards.std()) if B > 1 else 0.0,
            "env/response_length": float(rollout.mask.float().sum(dim=1).mean()),
            **measured,
            "objective/kl_coef": kl_coef,
            f"{self.name}/scores_scaled_mean": float(scores.mean()),
            **self.engine_stats(),
        }

    def mean_over_processes(self, values: torch.Tensor) -> float:
        """The mean of ``values`` over every process's games (data-parallel runs), as TRL
        0.7 updates its KL controller from statistics gathered over all processes."""
        mean = values.float().mean()
        if self.accelerator.num_processes > 1:
            mean = self.accelerator.reduce(mean.to(self.device), reduction="mean")
        return float(mean)

    def sampled_logprobs(self, logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each response token's log-prob under the distribution it was drawn from: the
        model's own, or as the sampling settings reshape it (``agents/sampling.py``), so the
        ratio to the log-probs recorded while acting starts at exactly 1."""
        if not self.sampling.is_model:
            seen = None
            if self.sampling.needs_history:
                seen = seen_before_each(mb["prompt_ids"], mb["prompt_mask"], mb["tokens"])
            logits = self.sampling.logits(logits, seen)
        return pm.selective_log_softmax(logits, mb["tokens"])

    def rows_on_device(
        self, data: dict[str, torch.Tensor], rows: torch.Tensor, steps: int
    ) -> dict[str, torch.Tensor]:
        """``rows`` of the batch tensors on the device, their sequences minus the padding
        all those rows share (never the ``steps`` response columns or the one before)."""
        mb = {k: v[rows] for k, v in data.items()}
        mb["ids"], mb["attention"], mb["positions"] = without_shared_padding(
            mb["attention"], mb["ids"], mb["attention"], mb["positions"], keep=steps + 1
        )
        return {k: v.to(self.device) for k, v in mb.items()}

    def steps_in_backward(self) -> bool:
        """Whether the update steps each parameter as soon as its gradient is complete
        (:class:`agents.speedups.StepInBackward`).

        When a mini-batch is one chunk of one micro-batch, nothing accumulates between
        backward passes, so Adam can take each parameter's step inside the backward pass
        and free its gradient at once, for the same update. Clipping needs every gradient
        first, and data-parallel training averages them after the backward pass, so those
        keep the plain step.
        """
        cfg = self.config
        return (
            cfg.gradient_accumulation_steps == 1
            and cfg.forward_batch_size >= cfg.mini_batch_size
            and cfg.max_grad_norm is None
            and self.accelerator.num_processes == 1
        )
