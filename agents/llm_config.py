"""The settings every LLM learner shares (:class:`LLMConfig`): sampling, the KL penalty and its
controller, score scaling and the optimiser's batches. A leaf: the learners' configs
subclass it, and nothing here imports a learner."""

from __future__ import annotations

from dataclasses import dataclass

from cory_env import checks
from cory_rl.agents import engine_correction as ec
from cory_rl.agents import kl_penalty as kp


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
