"""Dynamic sampling (DAPO, Yu et al. 2025): train only on groups whose rewards differ.

A group whose k answers all scored alike has zero advantage for every answer: it adds
tokens to the batch and nothing to the policy gradient. With ``dynamic_sampling`` a group
learner keeps the groups whose rewards differ and asks the loop for more batches
(``wants_more``) until it has a batch's worth of groups or has drawn
``max_extra_batches`` more. A batch still short then is filled up with the dropped
groups, in the order they were drawn, so every update has the same number of answers
(mini-batches stay whole and data-parallel processes take the same steps).
"""

from __future__ import annotations

import torch

from cory_rl.agents.rollout import Rollout, concat_rollouts, rollout_rows

ZERO_STD = 1e-8
"""A group whose rewards' std is at most this counts as all alike."""


class DynamicSampling:
    """The groups kept so far in one iteration, and what was dropped and drawn."""

    def __init__(self, group_size: int, max_extra_batches: int, pad_token_id: int) -> None:
        self.group_size = group_size
        self.max_extra_batches = max_extra_batches
        self.pad_token_id = pad_token_id
        self._reset()

    def _reset(self) -> None:
        self.target: int | None = None  # groups in one batch
        self.kept: list[Rollout] = []
        self.dropped: list[Rollout] = []
        self.kept_groups = self.dropped_groups = self.extra_batches = 0

    def add(self, rollout: Rollout) -> Rollout:
        """Take one played batch; the batch to learn from so far."""
        k = self.group_size
        groups = len(rollout.rewards) // k
        if self.target is None:
            self.target = groups
        else:
            self.extra_batches += 1
        alike = rollout.rewards.view(groups, k).std(dim=1) <= ZERO_STD
        for keep, into in ((~alike, self.kept), (alike, self.dropped)):
            ids = keep.nonzero().squeeze(1)
            if len(ids):
                rows = (ids[:, None] * k + torch.arange(k)).reshape(-1)
                into.append(rollout_rows(rollout, rows))
        self.kept_groups += int((~alike).sum())
        self.dropped_groups += int(alike.sum())
        return self.batch()

    def wants_more(self) -> bool:
        return (
            self.target is not None
            and self.kept_groups < self.target
            and self.extra_batches < self.max_extra_batches
        )

    def batch(self) -> Rollout:
        """A batch's worth of groups: the kept ones first, then dropped ones if short."""
        rows = self.target * self.group_size
        return rollout_rows(
            concat_rollouts(self.kept + self.dropped, self.pad_token_id), torch.arange(rows)
        )

    def finish(self, prefix: str) -> dict[str, float]:
        """This iteration's counts (then forgotten): groups kept and dropped over every
        batch drawn, the extra batches, and the dropped groups that filled the batch."""
        filled = max(self.target - self.kept_groups, 0) if self.target else 0
        stats = {
            f"{prefix}/dynamic/kept_groups": float(self.kept_groups),
            f"{prefix}/dynamic/dropped_groups": float(self.dropped_groups),
            f"{prefix}/dynamic/extra_batches": float(self.extra_batches),
            f"{prefix}/dynamic/filled_groups": float(filled),
        }
        self._reset()
        return stats
