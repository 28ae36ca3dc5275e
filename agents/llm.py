"""The base of every LLM learner: its settings (:class:`LLMConfig`), its turns and
rollouts, and the frame of an update. A learner built on it supplies ``learn`` (its
advantages and its loss) and its own settings.

:class:`LLMLearner` is composed of parts that each own their state and take what else
they use as arguments: the optimisation (policy, Adam, shuffle; ``agents/update.py``,
which also steps a loss over mini-batches), the token sampler (``llm_acting.py``, with
the token-by-token acting step), the reward shaping (reference, KL controller, score
scaling; ``llm_reference.py``) and the seat on a rollout engine (``llm_engine_seat.py``).
Save and load are functions of those parts (``llm_state.py``).

Acting goes token by token with a KV cache, recording each sampled token's log-prob and
the value as it goes, so a rollout costs no more than ``generate()``. The model plumbing
(value head, reference, LoRA sharing) is in ``agents/policy.py``; the RL math, each term
checked against hand-computed values, in ``agents/ppo_math.py`` and ``agents/pg_math.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import llm_state, state_io, turns
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.base import Learner
from cory_rl.agents.engine import RolloutEngine
from cory_rl.agents.export import export_policy
from cory_rl.agents.llm_acting import TokenSampler, next_token
from cory_rl.agents.llm_engine_seat import EngineSeat, engine_logprobs
from cory_rl.agents.llm_reference import RewardShaping, ShapedRollout
from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.rollout import Rollout, Turn, concat_rollouts
from cory_rl.agents.update import LossFn, Optimisation, minibatch_update


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
    share_prompt_prefix: bool = False
    """Run the prompt beginning that a forward pass's rows share (a few-shot task's worked
    examples, a group's one prompt) once, in the update and the reference pass, instead of
    once per row (``agents/prefix.py``). The same logits and gradients up to float
    rounding, so not bit-identical to a run without it. A speed setting only."""
    max_grad_norm: float | None = None
    """Clip each optimiser step's gradients to this total norm; None = no clipping (then,
    where nothing accumulates, Adam steps inside the backward pass: ``agents/update.py``)."""
    target_kl: float | None = None
    """Stop an update's epochs at the first mini-batch whose ``approx_kl`` (per token, to
    the acting policy) exceeds 1.5x this; None = take every step (``agents/update.py``)."""
    kl_penalty: str = "full"
    """How the KL to the reference enters the update (``agents/kl_penalty.py``). Exact, the
    gradient of E[R - beta KL]: ``full`` (each state's KL over the vocabulary in its token's
    reward and, differentiated, in the loss), ``k1`` (the sampled log-ratio in the reward;
    TRL's PPO), ``k3``. Fidelity forms, biased: ``full_in_reward`` (the official CORY code,
    TRL 0.7's ``full``), ``k3_in_reward``, ``abs_in_reward``, ``mse_in_reward`` (TRL 0.7's),
    ``k3_in_loss`` (GRPO's KL term, TRL's)."""
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
            checks.number(
                self.max_grad_norm,
                "max_grad_norm",
                **positive,
                hint="a negative norm would reverse the gradients",
            )
        if self.score_clip is not None:
            checks.number(self.score_clip, "score_clip", **positive)
        if self.target_kl is not None:
            checks.number(
                self.target_kl,
                "target_kl",
                **positive,
                hint="per-token approx_kl, typically 0.01-0.05",
            )
        for name in (
            "mini_batch_size",
            "gradient_accumulation_steps",
            "forward_batch_size",
            "kl_horizon",
        ):
            checks.integer(getattr(self, name), name, minimum=1, where=w)
        checks.integer(self.top_k, "top_k", minimum=0, where=w, hint="0 = off")
        for name in (
            "adaptive_kl",
            "whiten_advantages",
            "score_scaling",
            "score_norm",
            "share_prompt_prefix",
        ):
            checks.boolean(getattr(self, name), name, where=w)
        checks.choice(self.kl_penalty, "kl_penalty", tuple(kp.FORMS), where=w)
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


class LLMLearner(Learner):
    """An LLM playing one seat (a :class:`cory_rl.agents.base.Learner`); subclasses add
    ``learn``.

    It is made of parts that each own their state and are handed what else they use:

    - ``optimisation`` (:class:`cory_rl.agents.update.Optimisation`): the policy, Adam,
      the step inside the backward pass, the mini-batches' shuffle and the sharding;
    - ``sampler`` (:class:`cory_rl.agents.llm_acting.TokenSampler`): the sampling
      distribution, the sampling generator and common random numbers;
    - ``shaping`` (:class:`cory_rl.agents.llm_reference.RewardShaping`): the reference,
      the KL controller and the score statistics;
    - ``engine_seat`` (:class:`cory_rl.agents.llm_engine_seat.EngineSeat`): a rollout
      engine, if attached, and the gaps between its log-probs and the learner's.

    The learner itself keeps the turn being played, the rollout collected, the version of
    its weights and its probe. ``learn`` reads as: :meth:`start_update` (the rollout, its
    KL to the reference and its scaled scores), the learner's own advantages and loss,
    :meth:`update` (``agents/update.py``), :meth:`finish` (the KL controller and the
    statistics every learner reports).

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
    multi_turn = True
    takes_sampling_noise = True
    exportable = True

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
        if config.share_prompt_prefix and policy.sharding is not None:
            raise checks.SettingError(
                "share_prompt_prefix runs a shared prompt beginning as a forward of its own, "
                "which sharded policies (FSDP2) have not been checked with; set it false, or "
                "sharding none"
            )
        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.device = self.accelerator.device
        self.pad_token_id = pad_token_id
        if not self.has_critic:
            policy.value_head.requires_grad_(False)
        policy.to(self.device).eval()  # dropout stays off: the PPO ratio compares one function
        autocast = self.accelerator.autocast
        self.optimisation = Optimisation(
            policy, config.learning_rate, self.accelerator, shuffle_seed=seed + 1
        )
        self.shaping = RewardShaping(reference, config, self.device, autocast)
        self.sampler = TokenSampler(config, self.device, seed)
        self.engine_seat = EngineSeat(config, self.device, autocast)
        self.turn: Turn | None = None
        """The turn being played (None between turns); read by the benchmark."""
        self.rollout: Rollout | None = None
        """The rollout collected since the last update (None = nothing yet)."""
        self.closed_turns: list[Rollout] = []
        """In a game of several rounds or seats, this episode's turns so far
        (:meth:`end_turn`), and the role each was played in."""
        self.closed_roles: list[int] = []
        self.last_turns: dict[int, Turn] = {}
        """In several seats: each role's last turn (what :meth:`turn_stats` reads)."""
        self.role_noise: dict[int, np.ndarray] = {}
        """Common random numbers per role (:meth:`use_sampling_noise` with a role)."""
        self.weights_version = 0
        """Counts changes of the weights (updates, loads, resets); an engine reloads them
        when it differs from the version it holds."""
        self.probe = Probe()

    # ------------------------------------------------------------------ read by others
    @property
    def model(self) -> PolicyWithValue:
        """The policy, without accelerate's wrapper."""
        return self.optimisation.model

    @property
    def policy(self) -> Any:
        """The policy as the update calls it (accelerate's wrapper); read by ``bench/``."""
        return self.optimisation.policy

    @property
    def optimizer(self) -> Any:
        """The policy's Adam; read by ``bench/``."""
        return self.optimisation.optimizer

    @property
    def reference(self) -> Reference:
        """The frozen reference; read by ``bench/``."""
        return self.shaping.reference

    @property
    def sharding(self) -> Any:  # the Learner capability
        return self.optimisation.sharding

    def watch(self, name: str, **info: Any) -> contextlib.AbstractContextManager[Any]:
        """The probe's phase ``name`` of this learner (what the parts run their work in)."""
        return self.probe.phase(name, self, **info)

    # ------------------------------------------------------------------ acting
    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Sample one token per row, reusing the KV cache within a turn; at a turn's first
        token, a rollout engine (if attached) plans the whole turn."""
        with self.watch("act", obs=obs), torch.no_grad():
            generated = np.asarray(obs["num_generated"])
            if (generated == 0).all():
                self.turn = Turn.start(obs, self.device)
                if self.role_noise:  # common noise per role: this seat's
                    self.sampler.use_noise(self.role_noise.get(self.turn.role))
                if self.seats > 1:  # each seat's last turn, for turn_stats
                    self.last_turns[self.turn.role] = self.turn
                self.optimisation.gather_weights()  # sharded: held until turn_over()
                if self.engine_seat.engine is not None and self.sampler.noise is None:
                    self.engine_seat.plan_turn(
                        self.turn, obs, self.model, self.sampler, self.weights_version
                    )
            exact_kl = kp.needs_full_logprobs(self.config.kl_penalty)
            return next_token(
                self.turn, generated, self.model, self.sampler, self.accelerator.autocast, exact_kl
            )

    def use_sampling_noise(self, noise: np.ndarray | None, role: int | None = None) -> None:
        """Draw each token with the given uniforms until called with None
        (:meth:`cory_rl.agents.llm_acting.TokenSampler.use_noise`); with ``role``, in the
        turns of that role only (a learner in several seats draws each seat's own)."""
        if role is None:
            self.role_noise = {}
            self.sampler.use_noise(noise)
        elif noise is None:
            self.role_noise.pop(int(role), None)
        else:
            self.sampler.use_noise(noise)  # checked now, used from the role's next turn
            self.role_noise[int(role)] = self.sampler.noise

    def attach_engine(self, engine: RolloutEngine | None, eos_token_id: int) -> None:
        """Take whole turns from ``engine`` (None: act token by token again)."""
        self.engine_seat.attach(engine, eos_token_id)

    def turn_over(self) -> None:
        """The game moved on from this seat's turn: free the weights gathered for it, and
        its KV cache (what is kept of the turn, to learn from or report, needs neither)."""
        self.optimisation.release_weights()
        if self.turn is not None:
            self.turn.cache = None

    def end_turn(self, num_generated: np.ndarray) -> None:
        """In a game of several rounds, or in several seats: keep the turn that ended (its
        ``num_generated`` tokens per row accepted) until the rewards come
        (:meth:`end_rollout`)."""
        self.closed_turns.append(self._close_turn(num_generated, np.zeros(len(num_generated))))
        self.closed_roles.append(self.turn.role)
        self.turn = None

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        """Keep the finished turn, or in a game of several rounds the turns :meth:`end_turn`
        kept with their rewards ``(B, rounds)``, for :meth:`learn`."""
        with self.watch("end_rollout", obs=obs):
            rewards = np.asarray(rewards)
            if rewards.ndim == 2:
                self.rollout = self._episodes_rollout(rewards)
            else:
                self.rollout = self.empty_answers(self._close_turn(obs["num_generated"], rewards))
        self.turn = None

    def empty_answers(self, rollout: Rollout) -> Rollout:
        """What becomes of a game of one turn in which this seat accepted no token (a
        refereed match over before its turn): left out of the update
        (:func:`cory_rl.agents.turns.without_empty_rows`)."""
        return turns.without_empty_rows(rollout)

    def has_experience(self) -> bool:  # the Learner capability
        return self.rollout is not None and len(self.rollout.rewards) > 0

    def discard_turn(self) -> None:
        """Let the finished turn(s) go and keep the rollout already collected (a batch the
        loop played for another seat's dynamic sampling)."""
        self.turn = None
        self.closed_turns, self.closed_roles = [], []

    def turn_credit(self, rewards: np.ndarray, roles: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """What each turn of a game of several rounds is credited with, from the rewards
        ``(B, K)`` the game paid (NaN: a turn not paid), and whether it was paid: here the
        turn's own reward, later ones reaching it through the learner's discount. ``roles``:
        the role of each column's turn (a learner in several seats plays several)."""
        return np.nan_to_num(rewards, nan=0.0), ~np.isnan(rewards)

    def _episodes_rollout(self, rewards: np.ndarray) -> Rollout:
        """The turns :meth:`end_turn` kept, one row each (turn after turn, each turn's B
        games), credited as :meth:`turn_credit` says; each seat's turns of a game are one
        episode (a seat's role is fixed within a game)."""
        closed, self.closed_turns = self.closed_turns, []
        roles, self.closed_roles = self.closed_roles, []
        B, K = rewards.shape
        if len(closed) != K:
            raise RuntimeError(
                f"end_rollout() with rewards for {K} turns after {len(closed)} end_turn() calls"
            )
        credit, paid = self.turn_credit(rewards, roles)
        for k, part in enumerate(closed):
            part.rewards = torch.as_tensor(credit[:, k], dtype=torch.float32)
        rollout = concat_rollouts(closed, self.pad_token_id)
        seat = {role: i for i, role in enumerate(dict.fromkeys(roles))}
        rollout.episode = torch.cat([torch.arange(B) + seat[r] * B for r in roles])
        rollout.turn = torch.as_tensor(
            [roles[:k].count(r) for k, r in enumerate(roles)]
        ).repeat_interleave(B)
        rollout.paid = torch.as_tensor(paid.T.reshape(-1))
        return self.empty_turns(rollout)

    def empty_turns(self, rollout: Rollout) -> Rollout:
        """What becomes of turns in which no token was accepted (a refereed game's rows
        that waited): left out, their pay credited to the episode's previous turn
        (:func:`cory_rl.agents.turns.without_empty_turns`)."""
        return turns.without_empty_turns(rollout)

    def _close_turn(
        self, num_generated: np.ndarray, rewards: np.ndarray, turn: Turn | None = None
    ) -> Rollout:
        """The turn (default: the one being played) as a rollout: the tokens the game
        accepted and the rewards it paid."""
        turn = turn or self.turn
        if turn is None or not turn.tokens:
            raise RuntimeError("end_rollout() without a turn: act() was never called this game")
        accepted = torch.as_tensor(np.asarray(num_generated), dtype=torch.long)
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
            engine_logprobs=engine_logprobs(turn, mask),
        )

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Summed KL to the reference, summed log-prob, mean entropy and final value per game
        (in several seats, of the last turn of the seat whose ``obs`` it is)."""
        turn = self.turn
        if self.seats > 1:
            turn = self.last_turns.get(int(np.asarray(obs["role"]).reshape(-1)[0]), turn)
        if turn is None or not turn.tokens:
            return {}
        generated = obs["num_generated"]
        rollout = self._close_turn(generated, np.zeros(len(generated)), turn)
        mask = rollout.mask.float()
        lengths = mask.sum(dim=1)
        last = (lengths.long() - 1).clamp(min=0)[:, None]
        if rollout.full_logprobs is not None:
            entropy = pm.entropy_from_logits(rollout.full_logprobs)
        else:
            entropy = torch.stack(turn.entropies, dim=1)
        exact = "full" if rollout.full_logprobs is not None else None
        return {
            "kl": self.reference_pass(rollout, exact)[0].sum(dim=1).numpy(),
            "logprob": rollout.logprobs.sum(dim=1).numpy(),
            "entropy": ((entropy * mask).sum(dim=1) / lengths.clamp(min=1)).numpy(),
            "value": rollout.values.gather(1, last).squeeze(1).numpy(),
            "length": lengths.numpy(),
        }

    # ------------------------------------------------------------------ learning
    def learn(self) -> dict[str, float]:
        """One update on the rollout collected since the last call (the learner's own)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    def take_rollout(self) -> Rollout:
        """The rollout collected since the last :meth:`learn` (then forgotten), with the
        engine correction's weights of its tokens, if an engine drew them."""
        if self.rollout is None:
            raise RuntimeError("learn() before any end_rollout(): nothing was collected")
        rollout, self.rollout = self.rollout, None
        rollout.is_weights = self.engine_seat.correction_weights(rollout)
        return rollout

    def start_update(self) -> ShapedRollout:
        """What every update starts from: the rollout collected (:meth:`take_rollout`), its
        KL to the reference, its scaled scores and the KL coefficient in force."""
        return self.shaping.shape(self.take_rollout(), self.watch)

    def reference_pass(
        self, rollout: Rollout, measure: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The KL to the reference per token (``measure``: ``full`` or a sampled estimator;
        default the configured penalty's) and the reference's token log-probs
        (:meth:`cory_rl.agents.llm_reference.RewardShaping.reference_pass`)."""
        return self.shaping.reference_pass(rollout, self.watch, measure)

    def reference_kl(self, rollout: Rollout) -> torch.Tensor:
        """KL(pi || pi_ref) per response token (see :meth:`reference_pass`)."""
        return self.reference_pass(rollout)[0]

    def penalty_data(
        self, shaped: ShapedRollout, advantage_scale: torch.Tensor | float = 1.0
    ) -> dict[str, torch.Tensor]:
        """What the loss part of the KL penalty reads from the batch (:meth:`penalty_loss`):
        its weight per row (``kl_weight``: beta, times ``advantage_scale``, what the
        advantages were scaled by, for an exact form) and the reference's log-probs. Empty
        for a form with no loss part, or with no reference pass (beta fixed at 0)."""
        name = self.config.kl_penalty
        if not self.shaping.needs_reference_pass or kp.form(name).in_loss is None:
            return {}
        rows = len(shaped.rollout.rewards)
        weight = kp.loss_weight(name, shaped.kl_coef, advantage_scale)
        data = {"kl_weight": weight.expand(rows).clone(), "ref_logprobs": shaped.ref_logprobs}
        if shaped.ref_full_logprobs is not None:
            data["ref_full_logprobs"] = shaped.ref_full_logprobs
        return data

    def penalty_loss(
        self, mb: dict[str, torch.Tensor], logits: torch.Tensor
    ) -> torch.Tensor | None:
        """The KL penalty's loss part per token (B, T), weighted by ``kl_weight``, with its
        gradient (``agents/kl_penalty.py``); None where :meth:`penalty_data` gave nothing.
        The KL is the model's own distribution's, whatever the sampling settings."""
        if "kl_weight" not in mb:
            return None
        name = self.config.kl_penalty
        own = None
        if kp.form(name).in_loss == "k3":
            own = pm.selective_log_softmax(logits, mb["tokens"])
        part = kp.loss_part(name, logits, own, mb["ref_logprobs"], mb.get("ref_full_logprobs"))
        return mb["kl_weight"][:, None].to(part.dtype) * part

    def update(
        self,
        data: dict[str, torch.Tensor],
        loss_fn: LossFn,
        *,
        epochs: int,
        unit: Literal["token", "answer"] = "token",
        weigh_micro_batches: Literal["rows", "units"] = "units",
        prefix: str | None = None,
        loss_mask: str = "mask",
    ) -> dict[str, float]:
        """Step ``loss_fn`` over ``data`` (:func:`cory_rl.agents.update.minibatch_update`,
        its statistics under ``prefix``, default the learner's name); the weights changed,
        so their version moves on (a rollout engine reloads them before its next turn)."""
        stats = minibatch_update(
            self.optimisation,
            data,
            loss_fn,
            self.config,
            epochs=epochs,
            prefix=prefix or self.name,
            watch=self.watch,
            unit=unit,
            weigh_micro_batches=weigh_micro_batches,
            loss_mask=loss_mask,
        )
        self.weights_version += 1
        return stats

    def finish(self, shaped: ShapedRollout) -> dict[str, float]:
        """Update the KL controller from the batch's mean summed KL (over every process);
        return the statistics every LLM learner reports (the loop's ``kl`` is
        ``objective/kl``). In a game of several rounds an answer is a turn: the KL is a
        turn's, the rewards those of the turns paid."""
        rollout = shaped.rollout
        seq_kl = shaped.kl.sum(dim=1)
        B = len(rollout.rewards)
        measured = {}
        if self.shaping.needs_reference_pass:  # else no KL was measured: none is reported
            mean_kl = self.optimisation.mean_over_processes(seq_kl)
            self.shaping.kl_ctl.update(mean_kl, B * self.accelerator.num_processes)
            measured = {"objective/kl": float(seq_kl.mean())}
        paid = rollout.rewards if rollout.paid is None else rollout.rewards[rollout.paid]
        return {
            "env/reward_mean": float(paid.mean()),
            "env/reward_std": float(paid.std()) if len(paid) > 1 else 0.0,
            "env/response_length": float(rollout.mask.float().sum(dim=1).mean()),
            **measured,
            "objective/kl_coef": shaped.kl_coef,
            f"{self.name}/scores_scaled_mean": float(shaped.scores.mean()),
            **self.engine_seat.stats(),
        }

    def restart(self) -> None:
        """A fresh optimiser state, KL coefficient and score statistics; the weights, the
        value head and the random streams are kept. What the official CORY code's
        save-and-reload at each role exchange amounts to (``restart_on_exchange``)."""
        self.optimisation.restart()
        self.shaping.restart()

    # ------------------------------------------------------------------ persistence
    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """Weights, optimiser, RNG, KL and score states (``agents/llm_state.py``)."""
        llm_state.save(
            path, self.name, self.config, self.optimisation, self.sampler, self.shaping, writer
        )

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a bad file raises ``CheckpointError`` naming it."""
        self.weights_version += 1  # the weights change (an engine reloads them)
        llm_state.load(path, self.name, self.optimisation, self.sampler, self.shaping)

    def process_rng(self) -> dict[str, torch.Tensor]:
        """This process's random streams (each process of a run draws its own)."""
        return llm_state.process_rng(self.sampler, self.optimisation)

    def load_process_rng(self, states: dict[str, torch.Tensor]) -> None:
        llm_state.load_process_rng(states, self.sampler, self.optimisation)

    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """The policy as a Hugging Face model folder plus its value head (agents/export.py)."""
        return export_policy(self.model, tokenizer, path, merge, info)
