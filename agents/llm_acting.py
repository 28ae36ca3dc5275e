"""How an LLM learner acts: token by token with a KV cache, each token drawn from the
sampling distribution or, under common random numbers, from the uniforms it is given.

A part of :class:`agents.llm.LLMLearner` (its acting), kept apart by job.
"""

from __future__ import annotations

import numpy as np
import torch

from cory_rl.agents import ppo_math as pm
from cory_rl.agents.rollout import (
    Turn,
)


class Acting:
    """The acting of :class:`agents.llm.LLMLearner` (module doc)."""

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
            self.gather_for_turn()
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
