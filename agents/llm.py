"""The base of every LLM learner: acting, rollouts, the reference pass, KL control, score
scaling, save/load and export. A learner built on it supplies ``learn`` (its advantages and
its loss, stepped by :func:`agents.update.minibatch_update`) and its own settings.

Acting goes token by token with a KV cache, recording each sampled token's log-prob and
the value as it goes, so a rollout costs no more than ``generate()``. The model plumbing
(value head, reference, LoRA sharing) is in ``agents/policy.py``; the RL math, each term
checked against hand-computed values, in ``agents/ppo_math.py`` and ``agents/pg_math.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import ppo_math as pm
from agents import state_io
from agents.engine import RolloutEngine, SamplingSettings, hf_weights
from agents.export import export_policy
from agents.policy import PolicyWithValue, Reference
from agents.rollout import (
    Rollout,
    Turn,
    by_prompt_length,
    response_logits,
    without_shared_padding,
)
from agents.sampling import SamplingDistribution, seen_before_each
from agents.speedups import StepInBackward, make_adam
from cory_env import checks

FORMAT = 1
"""Version of the files :meth:`LLMLearner.save` writes."""


@dataclass
class LLMConfig:
    """Settings every LLM learner shares: sampling, the KL penalty and its controller, score
    scaling and the optimiser's batches (defaults: CORY's IMDB settings)."""

    learning_rate: float = 1.41e-5
    mini_batch_size: int = 16
    """Answers per optimiser step."""
    gradient_accumulation_steps: int = 1
    """Micro-batches a mini-batch is accumulated from."""
    forward_batch_size: int = 16
    """Rows per forward pass, of the reference and of the policy in the update: a larger
    micro-batch is computed in chunks whose gradients add up to its own exactly. A
    memory and speed setting only."""
    max_grad_norm: float | None = None
    target_kl: float | None = None
    """Stop an update's epochs at the first mini-batch whose ``approx_kl`` (per token, to
    the acting policy) exceeds 1.5x this; None = take every step (``agents/update.py``)."""
    kl_estimator: str = "full"
    """``full``: exact full-vocabulary KL; or a sampled estimator: k1, k3, abs, mse."""
    adaptive_kl: bool = True
    init_kl_coef: float = 0.3
    kl_target: float = 6.0
    kl_horizon: int = 10000
    whiten_advantages: bool = True
    score_scaling: bool = True
    score_norm: bool = True
    score_clip: float | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    """Sampling penalty on tokens already in the context (the official scripts: 1.1)."""

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


class LLMLearner:
    """An LLM playing one seat (a :class:`agents.base.Learner`); subclasses add ``learn``.

    ``has_critic = False`` freezes the value head: acting still computes it and checkpoints
    keep it, but no loss uses it, so it never moves. Without LoRA it is also out of the
    optimiser; with LoRA ``PolicyWithValue.trainable_parameters`` lists it regardless, and
    it sits there with no gradient, so Adam neither keeps state for it nor updates it.
    """

    name = "llm"
    """The registered name, written into the agent's checkpoint."""
    has_critic = True

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
        optimizer = make_adam(policy.trainable_parameters(), config.learning_rate)
        self.policy, self.optimizer = self.accelerator.prepare(policy, optimizer)
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

    @property
    def model(self) -> PolicyWithValue:
        return self.accelerator.unwrap_model(self.policy)

    def learn(self) -> dict[str, float]:
        """One update on the rollout collected since the last call (the learner's own)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    # ------------------------------------------------------------------ acting
    def use_sampling_noise(self, noise: np.ndarray | None) -> None:
        """Draw the t-th token of row b by inverting the sampling distribution's CDF at
        ``noise[b, t]`` (uniforms in [0, 1), shape (B, steps)), until called with None.

        Evaluation gives the base model and every trained agent the same uniforms for the
        same (query, sample, role), so two policies answer with common random numbers: an
        identical policy gives identical answers, and a paired difference measures the
        policies, not the draws. The own generator is neither used nor advanced meanwhile.
        """
        if noise is not None:
            noise = np.asarray(noise, dtype=np.float64)
            if noise.ndim != 2 or ((noise < 0) | (noise >= 1)).any():
                raise ValueError(
                    f"sampling noise must be a (games, steps) array of uniforms in [0, 1), got "
                    f"shape {noise.shape}"
                )
        self.sampling_noise = noise

    def draw(self, probs: torch.Tensor, step: int) -> torch.Tensor:
        """One token per row from (B, V) ``probs``: the own generator, or the inverse CDF
        at the row's common uniform (:meth:`use_sampling_noise`). Both draw exactly from
        ``probs``; a token of probability 0 is never drawn."""
        noise = self.sampling_noise
        if noise is None:
            return torch.multinomial(probs, 1, generator=self.generator)
        if noise.shape[0] != len(probs) or noise.shape[1] <= step:
            raise ValueError(
                f"sampling noise of shape {noise.shape} has no uniform for token {step} of "
                f"{len(probs)} games"
            )
        cdf = probs.double().cumsum(dim=-1)
        u = torch.as_tensor(noise[:, step], dtype=torch.float64, device=cdf.device)
        # The first token whose CDF exceeds u * total: never one of probability 0.
        token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        return token.clamp(max=probs.shape[-1] - 1)

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Sample one token per row, reusing the KV cache within a turn."""
        with self.probe.phase("act", self, obs=obs), torch.no_grad():
            return self._act(obs)

    def _act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        generated = np.asarray(obs["num_generated"])
        if (generated == 0).all():
            self.turn = turn = Turn.start(obs, self.device)
            if self.engine is not None and self.sampling_noise is None:
                self._plan_turn(obs)
            if turn.planned:
                return turn.tokens[0].numpy()
            inputs, positions = turn.prompt_ids.to(self.device), turn.positions
        elif self.turn is not None and self.turn.planned:
            step = int(generated.max())
            if step >= len(self.turn.tokens):
                raise RuntimeError(
                    f"the game asked for token {step + 1} of a turn the engine ended after "
                    f"{len(self.turn.tokens)}"
                )
            return self.turn.tokens[step].numpy()
        else:
            turn = self.turn
            if turn is None or len(turn.tokens) != int(generated.max()):
                raise RuntimeError(
                    "act() got a mid-turn observation it did not take part in; the "
                    "agent must act from the first token of its turn"
                )
            inputs = turn.tokens[-1].to(self.device)[:, None]
            turn.mask = torch.cat([turn.mask, torch.ones_like(inputs)], dim=1)
            positions = turn.positions = turn.positions[:, -1:] + 1
        with self.accelerator.autocast():
            logits, values, turn.cache = self.model(
                inputs, turn.mask, positions, cache=turn.cache, use_cache=True, keep=1
            )
        logits = logits[:, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)  # the model's own distribution
        if self.sampling.needs_history and turn.seen is None:
            turn.seen = (turn.prompt_ids.to(self.device), turn.prompt_mask.bool().to(self.device))
        sampled = self.sampling.logits(logits, turn.seen)
        action = self.draw(torch.softmax(sampled, dim=-1), len(turn.tokens))
        if turn.seen is not None:
            ids, real = turn.seen
            turn.seen = (
                torch.cat([ids, action], 1),
                torch.cat([real, torch.ones_like(action, dtype=torch.bool)], 1),
            )
        action = action.squeeze(-1)
        sample_logprobs = logprobs if self.sampling.is_model else sampled.log_softmax(-1)
        turn.tokens.append(action.cpu())
        turn.logprobs.append(logprobs.gather(-1, action[:, None]).squeeze(-1).cpu())
        turn.sample_logprobs.append(sample_logprobs.gather(-1, action[:, None]).squeeze(-1).cpu())
        turn.values.append(values[:, -1].float().cpu())
        if self.config.kl_estimator == "full" or self.sampling_noise is not None:
            # The entropy follows from these; an evaluation (common noise) keeps them
            # whatever the estimator, so that it reports the exact KL.
            turn.full_logprobs.append(logprobs.cpu())
        else:
            turn.entropies.append(pm.entropy_from_logits(logits).cpu())
        return action.cpu().numpy()

    # ------------------------------------------------------------------ a rollout engine
    def attach_engine(self, engine: RolloutEngine | None, eos_token_id: int) -> None:
        """Take whole turns from ``engine`` (None: act token by token again); the game
        ends a row at ``eos_token_id``, the engine too."""
        self.engine, self.eos_token_id = engine, int(eos_token_id)

    def engine_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """This seat's language model as a checkpoint's weights (its adapter merged)."""
        return hf_weights(self.model.lm, self.model.adapter)

    def save_adapter(self, folder: Path) -> None:
        """This seat's LoRA adapter as peft writes one (for an engine's LoRA request)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        lm, name = self.model.lm, self.model.adapter
        folder.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(lm, adapter_name=name)
        save_file(
            {k: v.contiguous() for k, v in state.items()}, folder / "adapter_model.safetensors"
        )
        lm.peft_config[name].save_pretrained(str(folder))

    def _engine_holds_this_seat(self) -> None:
        if self.model.adapter is not None and getattr(self.engine, "adapters", False):
            self.engine.hold_adapter(self, self.weights_version, self.save_adapter)
        else:
            self.engine.hold(self, self.weights_version, self.engine_weights)

    @torch.no_grad()
    def _plan_turn(self, obs: dict[str, np.ndarray]) -> None:
        """The whole turn from the engine, then the learner's own log-probs and values
        of it, as acting token by token would have recorded them."""
        turn, cfg = self.turn, self.config
        if "budget" not in obs:
            raise ValueError("a rollout engine needs each game's token budget: obs['budget']")
        budgets = [int(b) for b in np.asarray(obs["budget"])]
        B = len(budgets)
        pairs = zip(turn.prompt_ids, turn.prompt_mask, strict=True)
        prompts = [ids[m.bool()].tolist() for ids, m in pairs]
        seeds = torch.randint(2**31 - 1, (B,), generator=self.generator, device=self.device)
        self._engine_holds_this_seat()
        sampling = SamplingSettings(cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty)
        answer = self.engine.generate(prompts, budgets, sampling, seeds.tolist(), self.eos_token_id)
        for b, ids in enumerate(answer.tokens):
            if len(ids) < budgets[b] and (not ids or ids[-1] != self.eos_token_id):
                raise RuntimeError(
                    f"the engine ended game {b}'s answer after {len(ids)} of {budgets[b]} "
                    "tokens without EOS (is the engine's max_model_len too short?)"
                )
        T = max(1, max(len(ids) for ids in answer.tokens))
        tokens = torch.full((B, T), self.eos_token_id, dtype=torch.long)  # after EOS: ignored
        engine_lp, seen = torch.full((B, T), float("nan")), torch.zeros(B, T, dtype=torch.bool)
        for b, (ids, lps) in enumerate(zip(answer.tokens, answer.logprobs, strict=True)):
            tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            engine_lp[b, : len(lps)] = torch.tensor(lps)
            seen[b, : len(lps)] = True
        ids = torch.cat([turn.prompt_ids, tokens], dim=1)
        mask = torch.cat([turn.prompt_mask, torch.ones_like(tokens)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        columns: dict[str, list[torch.Tensor]] = {
            "logprobs": [], "sample_logprobs": [], "values": [], "full_logprobs": [],
            "entropies": [],
        }  # fmt: skip
        for rows in torch.arange(B).split(cfg.forward_batch_size):
            inputs = [x[rows].to(self.device) for x in (ids, mask, positions)]
            with self.accelerator.autocast():
                logits, values, _ = self.model(*inputs, keep=T + 1)
            logits = response_logits(logits, T)
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen = tokens[rows].to(self.device)
            mb = {"prompt_ids": inputs[0][:, : -T], "prompt_mask": inputs[1][:, : -T],
                  "tokens": chosen}  # fmt: skip
            sampled = self.sampled_logprobs(logits, mb) if not self.sampling.is_model else None
            own = logprobs.gather(-1, chosen[..., None]).squeeze(-1)
            columns["logprobs"].append(own.cpu())
            columns["sample_logprobs"].append((own if sampled is None else sampled).cpu())
            columns["values"].append(values[:, :-1].float().cpu())
            if cfg.kl_estimator == "full":
                columns["full_logprobs"].append(logprobs.cpu())
            else:
                columns["entropies"].append(pm.entropy_from_logits(logits).cpu())
        whole = {k: torch.cat(v) for k, v in columns.items() if v}
        for t in range(T):
            turn.tokens.append(tokens[:, t])
            for name, column in whole.items():
                getattr(turn, name).append(column[:, t])
        gap = engine_lp - whole["sample_logprobs"]
        self.engine_gaps.append(gap[seen])
        turn.planned = True

    def engine_stats(self) -> dict[str, float]:
        """How far the engine's log-probs of its tokens were from the learner's since the
        last call: ``kl`` (their mean difference, a k1 estimate of KL(engine || learner)
        per token) and the largest absolute gap; empty without an engine."""
        if not self.engine_gaps:
            return {}
        gaps, self.engine_gaps = torch.cat(self.engine_gaps), []
        return {"engine/kl": float(gaps.mean()), "engine/max_abs_gap": float(gaps.abs().max())}

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

    # ------------------------------------------------------------------ what every update needs
    @torch.no_grad()
    def reference_pass(
        self, rollout: Rollout, estimator: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched forward of the reference over the rollout: the KL(pi || pi_ref) per
        response token (by ``estimator``, default the configured one), and the reference
        log-prob of each sampled token (GRPO's k3 term). Both (B, T), zero on padding; both
        zero everywhere, with no forward, for an update that does not use them
        (:attr:`needs_reference_pass`, only when ``estimator`` is not given)."""
        if estimator is None and not self.needs_reference_pass:
            skipped = torch.zeros(rollout.tokens.shape)
            return skipped, skipped
        with self.probe.phase("reference", self):
            return self._reference_pass(rollout, estimator or self.config.kl_estimator)

    @property
    def needs_reference_pass(self) -> bool:
        """Whether the update uses the reference: not under a KL coefficient fixed at 0
        (``adaptive_kl false``, ``init_kl_coef 0``; TRL's GRPO default), where the pass would
        be computed only to be multiplied by 0. As TRL does, the update then skips it: the
        batch's KL is not measured (the learner reports none, zeros stand in for the pass's
        tensors), and the held-out evaluation still measures it."""
        return self.config.adaptive_kl or self.config.init_kl_coef > 0

    def _reference_pass(
        self, rollout: Rollout, estimator: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask, pos = rollout.sequences()
        B, T = rollout.tokens.shape
        kl, token_logprobs = torch.zeros(B, T), torch.zeros(B, T)
        everyone = by_prompt_length(torch.arange(B), rollout.prompt_mask)
        for rows in everyone.split(self.config.forward_batch_size):
            inputs = without_shared_padding(
                mask[rows], ids[rows], mask[rows], pos[rows], keep=T + 1
            )
            inputs = [x.to(self.device) for x in inputs]
            probe = self.probe.phase("reference_forward", self, inputs=inputs, keep=T + 1)
            with probe, self.accelerator.autocast():
                logits = self.reference.logits(*inputs, keep=T + 1)
            # One row at a time: the (T, V) log-softmax and the KL's (T, V) temporaries of a
            # whole chunk would be the reference pass's largest tensors, for no gain in speed.
            for row, row_logits in zip(rows.tolist(), response_logits(logits, T), strict=True):
                ref_lp = torch.log_softmax(row_logits, dim=-1).cpu()
                token_logprobs[row] = ref_lp.gather(-1, rollout.tokens[row, :, None]).squeeze(-1)
                if estimator == "full":
                    kl[row] = pm.kl_per_token(rollout.full_logprobs[row], ref_lp)
        if estimator != "full":
            kl = pm.kl_sampled(rollout.logprobs, token_logprobs, estimator)
        return kl * rollout.mask, token_logprobs * rollout.mask

    def reference_kl(self, rollout: Rollout) -> torch.Tensor:
        """KL(pi || pi_ref) per response token (see :meth:`reference_pass`)."""
        return self.reference_pass(rollout)[0]

    def take_rollout(self) -> Rollout:
        """The rollout collected since the last :meth:`learn` (then forgotten)."""
        if self.rollout is None:
            raise RuntimeError("learn() before any end_rollout(): nothing was collected")
        rollout, self.rollout = self.rollout, None
        return rollout

    def scaled_rewards(self, rollout: Rollout) -> torch.Tensor:
        """The rewards the game paid (the task scores, mixed by ``lam`` in a cooperative
        game), scaled as ``score_scaling``/``score_norm``/``score_clip`` say."""
        cfg = self.config
        moments = self.score_moments if cfg.score_scaling else None
        return pm.scale_scores(
            rollout.rewards.clone(), moments, cfg.score_scaling, cfg.score_norm, cfg.score_clip
        )

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

    def _fresh_kl_and_scores(self) -> tuple[Any, pm.RunningMoments]:
        cfg = self.config
        kl_ctl = (
            pm.AdaptiveKLController(cfg.init_kl_coef, cfg.kl_target, cfg.kl_horizon)
            if cfg.adaptive_kl
            else pm.FixedKLController(cfg.init_kl_coef)
        )
        return kl_ctl, pm.RunningMoments()

    def restart(self) -> None:
        """A fresh optimiser state, KL coefficient and score statistics; the weights, the
        value head and the random streams are kept. What the official CORY code's
        save-and-reload at each role exchange amounts to (``restart_on_exchange``)."""
        self.optimizer.state.clear()  # Adam's moments and step counts start again lazily
        self.kl_ctl, self.score_moments = self._fresh_kl_and_scores()

    # ------------------------------------------------------------------ persistence
    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """The policy as a Hugging Face model folder plus its value head (agents/export.py)."""
        return export_policy(self.model, tokenizer, path, merge, info)

    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """Weights, optimiser and RNG states as safetensors; the rest as JSON, written last
        (or queued on ``writer``, in that order)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state_io.save_tensors(self.model.policy_state_dict(), path / "policy.safetensors", writer)
        optimizer_tensors, optimizer_rest = state_io.split_optimizer_state(
            self.optimizer.state_dict()
        )
        tensors = {f"optimizer.{k}": v for k, v in optimizer_tensors.items()}
        tensors["rng.sampling"] = self.generator.get_state()
        tensors["rng.shuffle"] = self.shuffle_generator.get_state()
        state_io.save_tensors(tensors, path / "state.safetensors", writer)
        state_io.save_json(
            {
                "format": FORMAT,
                "learner": self.name,
                "optimizer": optimizer_rest,
                "kl_ctl": self.kl_ctl.state_dict(),
                "score_moments": self.score_moments.state_dict(),
                "config": asdict(self.config),
            },
            path / "agent.json",
            writer,
        )

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a bad file raises ``CheckpointError`` naming it."""
        path = Path(path)
        if not (path / "agent.json").exists() and (path / "agent.pt").exists():
            raise state_io.invalid(
                path / "agent.pt",
                "a pickled checkpoint of an older version; pickles can run code, so they are "
                "never loaded",
            )
        meta = state_io.require(
            state_io.load_json(path / "agent.json"),
            ("format", "optimizer", "kl_ctl", "score_moments"),
            path / "agent.json",
        )
        if meta["format"] != FORMAT:
            raise state_io.invalid(path / "agent.json", f"unknown format {meta['format']!r}")
        if meta.get("learner", self.name) != self.name:
            raise state_io.invalid(
                path / "agent.json",
                f"it holds a {meta['learner']!r} learner, this seat plays {self.name!r}",
            )
        policy = state_io.load_tensors(path / "policy.safetensors")
        tensors = state_io.load_tensors(path / "state.safetensors")
        self.weights_version += 1
        try:
            self.model.load_policy_state_dict(policy)
        except RuntimeError as err:
            raise state_io.invalid(
                path / "policy.safetensors", f"weights of a different model: {err}"
            ) from None
        try:
            optimizer = {k[10:]: v for k, v in tensors.items() if k.startswith("optimizer.")}
            self.optimizer.load_state_dict(
                state_io.join_optimizer_state(optimizer, meta["optimizer"])
            )
            self.generator.set_state(tensors["rng.sampling"])
            self.shuffle_generator.set_state(tensors["rng.shuffle"])
            self.kl_ctl.load_state_dict(meta["kl_ctl"])
            self.score_moments.load_state_dict(meta["score_moments"])
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            raise state_io.invalid(path, f"inconsistent agent state: {err!r}") from None
