"""The loop's hooks: callbacks that watch it, and the evaluations it runs when due.

A leaf, so that trackers, benchmarks and evaluations hook into the loop without importing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol


class Callback:
    """Hooks into the loop: subclass and override what you need (every hook does nothing).

    :meth:`phase` is entered around each phase of the loop, in this order per iteration:
    ``rollout`` (reset and play a batch), ``checkpoint`` (wait for the previous write),
    ``learn``, ``logging``, ``evaluation`` (when one is due), ``checkpoint`` (start the
    next write); after the last iteration ``final checkpoint write`` and ``plots``. A
    benchmark times them (``bench/bench_train.py``); a tracker reads :meth:`on_row`.
    """

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int) -> Iterator[None]:
        yield

    def on_row(self, row: dict[str, Any]) -> None:
        """A row of ``metrics.jsonl`` (an iteration's or an evaluation's) as it is logged."""

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        """The games ``samples.jsonl`` gets (every ``sample_every`` iterations)."""


class Hooks:
    """Every callback's hook at once."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for callback in self.callbacks:
                stack.enter_context(callback.phase(name, iteration))
            yield

    def on_row(self, row: dict[str, Any]) -> None:
        for callback in self.callbacks:
            callback.on_row(row)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        for callback in self.callbacks:
            callback.on_samples(iteration, samples)


class Evaluations(Protocol):
    """Held-out evaluations along training (``cory_rl.train.evaluation.along``), for the
    loop."""

    writes: bool
    """Whether it writes its files; the loop sets it (only the main process writes)."""

    def begin(self, learners: dict[str, Any], start: int) -> dict[str, Any] | None:
        """The evaluation before the first update (None when it is already logged)."""

    def due(self, iteration: int) -> bool:
        """Whether an evaluation follows this iteration's update."""

    def after(self, iteration: int, learners: dict[str, Any]) -> dict[str, Any]:
        """The evaluation after this iteration's update, as a metrics row."""
