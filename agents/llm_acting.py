"""How an LLM learner acts: token by token with a KV cache, each token drawn from the
sampling distribution or, under common random numbers, from the uniforms it is given.

:class:`TokenSampler` owns how tokens are drawn (the sampling distribution, the learner's
generator, the common uniforms); :func:`next_token` plays one step of a turn with the
model and a sampler it is given. Both are parts of :class:`cory_rl.agents.llm.LLMLearner`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cory_rl.agents import ppo_math as pm
from cory_rl.agents.policy import PolicyWithValue
from cory_rl.agents.rollout import Turn
from cory_rl.agents.sampling import SamplingDistribution, seen_before_each


class TokenSampler:
    """Draws tokens from the sampling distribution the settings describe
    (``agents/sampling.py``): with its own generator, or with given uniforms."""

    def __init__(self, settings: Any, device: torch.device, seed: int) -> None:
        """``settings``: ``temperature``, ``top_k``, ``top_p`` and ``repetition_penalty``
        (``agents/llm_config.py``'s ``LLMConfig``)."""
        self.generator = torch.Generator(device=device).manual_seed(seed)
        """The learner's sampling stream (and a rollout engine's seeds)."""
        self.distribution = SamplingDistribution(
            settings.temperature, settings.top_k, settings.top_p, settings.repetition_penalty
        )
        self.noise: np.ndarray | None = None
        """Common random numbers (:meth:`use_noise`); None = the own generator."""

    def use_noise(self, noise: np.ndarray | None) -> None:
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
        self.noise = noise

    def draw(self, probs: torch.Tensor, step: int) -> torch.Tensor:
        """One token per row from (B, V) ``probs``: the own generator, or the inverse CDF
        at the row's common uniform (:meth:`use_noise`). Both draw exactly from ``probs``;
        a token of probability 0 is never drawn."""
        noise = self.noise
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

    def sampled_logprobs(self, logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each response token's log-prob under the distribution it was drawn from: the
        model's own, or as the sampling settings reshape it (``agents/sampling.py``), so the
        ratio to the log-probs recorded while acting starts at exactly 1. ``mb`` holds the
        ``tokens`` and, for a repetition penalty, their ``prompt_ids`` and ``prompt_mask``."""
        distribution = self.distribution
        if not distribution.is_model:
            seen = None
            if distribution.needs_history:
                seen = seen_before_each(mb["prompt_ids"], mb["prompt_mask"], mb["tokens"])
            logits = distribution.logits(logits, seen)
        return pm.selective_log_softmax(logits, mb["tokens"])


def next_token(
    turn: Turn | None,
    generated: np.ndarray,
    model: PolicyWithValue,
    sampler: TokenSampler,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    exact_kl: bool,
) -> np.ndarray:
    """The turn's next token per row (``generated``: the tokens each row has so far): a
    planned turn's next one, or one forward of ``model`` on the KV cache and a draw by
    ``sampler``, recorded in ``turn`` (log-probs, value, and the full log-probs for
    ``exact_kl`` or the entropy)."""
    step = int(generated.max())
    if turn is not None and turn.planned:
        if step >= len(turn.tokens):
            raise RuntimeError(
                f"the game asked for token {step + 1} of a turn the engine ended after "
                f"{len(turn.tokens)}"
            )
        return turn.tokens[step].numpy()
    if turn is None or len(turn.tokens) != step:
        raise RuntimeError(
            "act() got a mid-turn observation it did not take part in; the "
            "agent must act from the first token of its turn"
        )
    device = turn.mask.device
    if not turn.tokens:  # the turn's first forward: its whole prompt
        inputs, positions = turn.prompt_ids.to(device), turn.positions
    else:
        inputs = turn.tokens[-1].to(device)[:, None]
        turn.mask = torch.cat([turn.mask, torch.ones_like(inputs)], dim=1)
        positions = turn.positions = turn.positions[:, -1:] + 1
    with autocast():
        logits, values, turn.cache = model(
            inputs, turn.mask, positions, cache=turn.cache, use_cache=True, keep=1
        )
    logits = logits[:, -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)  # the model's own distribution
    distribution = sampler.distribution
    if distribution.needs_history and turn.seen is None:
        turn.seen = (turn.prompt_ids.to(device), turn.prompt_mask.bool().to(device))
    sampled = distribution.logits(logits, turn.seen)
    action = sampler.draw(torch.softmax(sampled, dim=-1), len(turn.tokens))
    if turn.seen is not None:
        ids, real = turn.seen
        turn.seen = (
            torch.cat([ids, action], 1),
            torch.cat([real, torch.ones_like(action, dtype=torch.bool)], 1),
        )
    action = action.squeeze(-1)
    sample_logprobs = logprobs if distribution.is_model else sampled.log_softmax(-1)
    turn.tokens.append(action.cpu())
    turn.logprobs.append(logprobs.gather(-1, action[:, None]).squeeze(-1).cpu())
    turn.sample_logprobs.append(sample_logprobs.gather(-1, action[:, None]).squeeze(-1).cpu())
    turn.values.append(values[:, -1].float().cpu())
    if exact_kl or sampler.noise is not None:
        # The entropy follows from these; an evaluation (common noise) keeps them
        # whatever the estimator, so that it reports the exact KL.
        turn.full_logprobs.append(logprobs.cpu())
    else:
        turn.entropies.append(pm.entropy_from_logits(logits).cpu())
    return action.cpu().numpy()
