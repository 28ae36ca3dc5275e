"""What watches an LLM learner work (:class:`Probe`): each piece of its work runs inside a
phase the probe may time or count (``bench/``); by default it does nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


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
    def phase(self, name: str, learner: Any, **info: Any) -> Iterator[None]:
        yield
