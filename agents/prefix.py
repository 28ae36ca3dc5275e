"""Rows whose prompts begin alike compute that beginning once.

A few-shot task's worked examples open every prompt (arith's shots, GSM8K's one-shot
question), and a group's answers all follow one prompt: the forward passes of the update
and of the reference then run the same tokens through the model once per row. Here the
common beginning runs once, as a batch of one whose keys and values every row then reads
from the cache, and each row computes only the rest. The result is the full forward's, up
to float rounding (the matmuls see other shapes); gradients reach the shared part through
the cache, summed over the rows, as they would through each row's own copy.

Rows are left-padded prompts followed by the response columns; the shared part must end
before the last ``keep`` columns (the prompt's last token and the response), whose logits
are wanted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED_TOKENS = 8
"""A shorter common beginning is not worth the extra forward call."""


@dataclass(frozen=True)
class SharedPrefix:
    """The common beginning of a batch's rows and the rest of each row."""

    ids: torch.Tensor
    """(1, P) the shared tokens."""
    positions: torch.Tensor
    """(1, P) their position ids."""
    rest_ids: torch.Tensor
    """(B, S) the columns after the shared part, as the rows hold them."""
    rest_attention: torch.Tensor
    """(B, P + S) the attention mask over [shared part, rest]; a row's own copy of the
    shared tokens (where its padding is shorter than another row's) is masked."""
    rest_positions: torch.Tensor
    """(B, S) their position ids, continuing the shared part's."""


def shared_prefix(
    ids: torch.Tensor,
    attention: torch.Tensor,
    positions: torch.Tensor,
    keep: int,
    min_tokens: int = MIN_SHARED_TOKENS,
) -> SharedPrefix | None:
    """The longest beginning all rows share (each from its first attended column), at
    most up to the last ``keep`` columns; None where it is shorter than ``min_tokens`` or
    there is one row."""
    rows, length = ids.shape
    if rows < 2 or not bool(attention.any(dim=1).all()):
        return None
    first = attention.long().argmax(dim=1)  # each row's first real column (left padding)
    limit = length - keep - int(first.max())
    if limit < min_tokens:
        return None
    columns = first[:, None] + torch.arange(limit, device=ids.device)[None]
    aligned = ids.gather(1, columns)
    same = (aligned == aligned[:1]).all(dim=0) & attention.gather(1, columns).bool().all(dim=0)
    shared = int(same.long().cumprod(dim=0).sum())
    if shared < min_tokens:
        return None
    start = int(first.min()) + shared
    rest_attention = attention[:, start:].clone()
    own_copy = (
        torch.arange(length - start, device=ids.device)[None] < (first - first.min())[:, None]
    )
    rest_attention[own_copy] = 0
    ones = torch.ones(rows, shared, dtype=attention.dtype, device=attention.device)
    begin = int(first[0])
    return SharedPrefix(
        ids=ids[:1, begin : begin + shared],
        positions=positions[:1, begin : begin + shared],
        rest_ids=ids[:, start:],
        rest_attention=torch.cat([ones, rest_attention], dim=1),
        rest_positions=positions[:, start:],
    )
