"""A run's checkpoint: every learner, the game and the RNGs, with a loadable copy at every instant.

Layout of ``RUN/checkpoint/``: one folder per agent (the learner's own files), then
``rng.safetensors`` (torch's RNG and each learner's random streams, of every process) and
``state.json`` (iteration, and per process the game's state and the Python and NumPy RNGs).
``state.json`` is written last, so a folder that has it is complete.
Nothing is a pickle: a crafted file cannot run code.

The loop saves through a :class:`CheckpointWriter`: the states are taken at once, the
files are written by a background thread while the next rollout plays, and the loop waits
for it before the learners change their weights (:meth:`CheckpointWriter.wait`).

Saving writes ``checkpoint.tmp``, moves the current checkpoint to ``checkpoint.old``,
moves the new one into place and only then deletes ``.old``. Folders are discarded by a
rename to ``checkpoint.trash`` before deletion, so a half-deleted folder never looks
complete. Loading takes the first complete folder of ``checkpoint``, ``checkpoint.old``
and ``checkpoint.tmp`` (a crash at any step leaves one of them) and moves it into place.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from cory_env import BatchedTextGame
from cory_rl.agents import state_io
from cory_rl.agents.base import Learner
from cory_rl.train.core.distributed import Processes
from cory_rl.train.core.games import owners

CHECKPOINT_FORMAT = 2
MARKER = "state.json"


def _complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def _discard(folder: Path) -> None:
    """Delete ``folder`` without ever leaving a partial copy under its own name."""
    if not folder.exists():
        return
    trash = folder.with_name("checkpoint.trash")
    shutil.rmtree(trash, ignore_errors=True)
    folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def _process_state(game: BatchedTextGame, learners: dict[str, Learner]) -> dict:
    """This process's game and RNG states, as JSON, and its learners' random streams (each
    process of a run draws its own: a learner's files hold the main process's only)."""
    learners = owners(learners)  # a learner in several seats is one agent
    numpy_state = np.random.get_state()
    python_state = random.getstate()
    return {
        "game": game.state_dict(),
        "numpy_rng": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        "python_rng": [python_state[0], list(python_state[1]), python_state[2]],
        "torch_rng": torch.get_rng_state().tolist(),
        "learner_rng": {agent: learner.process_rng() for agent, learner in learners.items()},
    }


def _sharded(learner: Learner) -> bool:
    return learner.sharding is not None


def save_checkpoint(
    run_path: Path,
    learners: dict[str, Learner],
    game: BatchedTextGame,
    iteration: int,
    processes: Processes | None = None,
) -> None:
    """Write the whole state of a run after ``iteration`` so that it resumes exactly.

    Every process calls it (its game and RNG states are gathered); the main one writes.
    Returns when the checkpoint is on disk; the loop uses :class:`CheckpointWriter`.
    """
    writer = CheckpointWriter()
    writer.save(run_path, learners, game, iteration, processes)
    writer.wait()


class CheckpointWriter:
    """Saves checkpoints whose files are written in a background thread.

    :meth:`save` takes every state at the call (JSON as text, RNG states as copies, weights
    and optimiser moments by reference) and returns; the thread writes the files, the
    marker and the swap. Until :meth:`wait` returns, the learners' tensors must not change:
    the loop calls it before ``learn()``, so the write overlaps the next rollout. A failed
    write is raised by :meth:`wait`; the previous checkpoint is then still the loadable one.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(
        self,
        run_path: Path,
        learners: dict[str, Learner],
        game: BatchedTextGame,
        iteration: int,
        processes: Processes | None = None,
    ) -> None:
        self.wait()
        processes = processes or Processes()
        states = processes.gather(_process_state(game, learners))
        learners = owners(learners)  # a learner in several seats is one agent
        if processes.is_main:
            writes = _queue_writes(Path(run_path), learners, iteration, states)
            self._thread = threading.Thread(
                target=self._run, args=(writes,), name="checkpoint-writer", daemon=False
            )
            self._thread.start()
        else:  # a sharded learner gathers its full tensors with the main process's save
            for agent, learner in learners.items():
                if _sharded(learner):
                    learner.save(Path(run_path) / "checkpoint.tmp" / agent, state_io.WriteQueue())
        processes.wait()

    def _run(self, writes: list[Callable[[], None]]) -> None:
        _yield_to_the_loop()
        try:
            for write in writes:
                write()
        except BaseException as err:  # handed to the loop's thread by wait()
            self._error = err

    def wait(self) -> None:
        """Block until the last checkpoint is on disk; raise its error if writing failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


def _yield_to_the_loop() -> None:
    """Give this thread the lowest CPU priority (Linux: nice is per thread), so that the
    rollout it overlaps keeps its cores and the writer takes the time the rollout leaves
    idle; what is left is written at full speed while the loop waits before learning."""
    if sys.platform != "linux":  # elsewhere the id of a thread is not a process id
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:  # not permitted: write at normal priority
        pass


def _queue_writes(
    run_path: Path, learners: dict[str, Learner], iteration: int, states: list
) -> list[Callable[[], None]]:
    """Prepare ``checkpoint.tmp`` and return its writes, then the swap, in order.

    A learner whose ``save`` takes a ``writer`` (every LLM learner) queues its writes there;
    any other learner writes its files now, before the queue runs.
    """
    learners = owners(learners)
    current, old, tmp = (run_path / n for n in ("checkpoint", "checkpoint.old", "checkpoint.tmp"))
    _discard(tmp)
    tmp.mkdir(parents=True)
    writes = state_io.WriteQueue()
    for agent, learner in learners.items():
        learner.save(tmp / agent, writer=writes)
    rng = {
        f"torch.{p}": torch.tensor(s.pop("torch_rng"), dtype=torch.uint8)
        for p, s in enumerate(states)
    }
    for p, s in enumerate(states):
        for agent, streams in s.pop("learner_rng").items():
            rng.update({f"learner.{agent}.{name}.{p}": t for name, t in streams.items()})
    state_io.save_tensors(rng, tmp / "rng.safetensors", writes)
    run_state = {"format": CHECKPOINT_FORMAT, "iteration": iteration, "agents": list(learners)}
    # the marker: queued last, so a folder that has it is complete
    state_io.save_json({**run_state, "processes": states}, tmp / MARKER, writes)

    def swap() -> None:
        if _complete(current):
            _discard(old)
            current.rename(old)
        else:  # a crash left no complete current checkpoint: keep .old, the last good one
            _discard(current)
        tmp.rename(current)
        _discard(old)

    return [*writes, swap]


def load_learners(run_path: Path, learners: dict[str, Learner]) -> Path:
    """Each learner's weights and state from the run's complete checkpoint (by its agent
    name), for evaluation, export and play; returns the checkpoint folder."""
    folder = find_checkpoint(run_path)
    for agent, learner in owners(learners).items():
        learner.load(folder / agent)
    return folder


def find_checkpoint(run_path: Path) -> Path:
    """The complete checkpoint folder of a run, or a clear error."""
    run_path = Path(run_path)
    for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
        folder = run_path / name
        if _complete(folder):
            return folder
    raise FileNotFoundError(
        f"{run_path} has no complete checkpoint to resume from; start a new run instead"
    )


def _promote(folder: Path) -> Path:
    """Move a surviving ``.old``/``.tmp`` into place, so the next save starts from it."""
    current = folder.with_name("checkpoint")
    if folder != current:
        _discard(current)
        folder.rename(current)
    return current


def load_json_state(folder: Path) -> dict:
    """The run state (``state.json``) of a complete checkpoint folder."""
    return state_io.require(
        state_io.load_json(folder / MARKER),
        ("format", "iteration", "agents", "processes"),
        folder / MARKER,
    )


def checkpoint_updates(run_path: Path) -> int:
    """How many iterations (updates) the run's complete checkpoint holds."""
    return int(load_json_state(find_checkpoint(run_path))["iteration"]) + 1


def load_checkpoint(
    run_path: Path,
    learners: dict[str, Learner],
    game: BatchedTextGame,
    processes: Processes | None = None,
) -> int:
    """Restore learners, game and RNGs; returns the next iteration to run.

    Each process takes its own game and RNG states. Learners are restored from the main
    process's files (their weights are the same on every process).
    """
    processes = processes or Processes()
    learners = owners(learners)  # a learner in several seats is one agent
    if processes.is_main:
        _promote(find_checkpoint(run_path))
    processes.wait()
    folder = find_checkpoint(run_path)
    state = load_json_state(folder)
    if state["format"] != CHECKPOINT_FORMAT:
        raise state_io.invalid(folder / MARKER, f"unknown format {state['format']!r}")
    if sorted(state["agents"]) != sorted(learners):
        raise state_io.invalid(
            folder / MARKER,
            f"it holds agents {state['agents']} but this run has {sorted(learners)}",
        )
    rng = state_io.load_tensors(folder / "rng.safetensors")
    for agent, learner in learners.items():
        learner.load(folder / agent)
    saved = state["processes"]
    if not isinstance(saved, list) or not saved:
        raise state_io.invalid(folder / MARKER, "no process states")
    own = processes.index % len(saved)
    try:
        local = saved[own]
        game.load_state_dict(local["game"])
        torch.set_rng_state(rng[f"torch.{own}"])
        name, keys, *rest = local["numpy_rng"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        version, internal, gauss = local["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        for agent, learner in learners.items():
            prefix, suffix = f"learner.{agent}.", f".{own}"
            streams = {
                k[len(prefix) : -len(suffix)]: t
                for k, t in rng.items()
                if k.startswith(prefix) and k.endswith(suffix)
            }
            if streams:
                learner.load_process_rng(streams)
        iteration = int(state["iteration"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise state_io.invalid(folder / MARKER, f"inconsistent run state: {err!r}") from None
    if processes.index >= len(saved):  # more processes than saved: give them new games
        fresh = np.random.default_rng([processes.index, iteration]).bit_generator.state
        game.load_state_dict({**local["game"], "rng": fresh})
    return iteration + 1
