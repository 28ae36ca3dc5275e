"""What the loop needs to run data-parallel under ``accelerate launch``: who writes, and means.

Each process plays its own batch of games (the game is seeded per process), gradients are
averaged by DDP inside each learner's ``accelerator.backward``, logged metrics are means
over every process's games, and only the main process writes the run folder. On one
process every method is the identity, so the single-process path is unchanged.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

import torch

PROCESS_SEED_STRIDE = 100_003
"""Process p plays the games of seed ``seed + p * PROCESS_SEED_STRIDE``."""


PR_SET_PDEATHSIG = 1
"""Linux ``prctl`` option: the signal a process receives when its parent dies."""


def launched_by_torchrun() -> bool:
    """Whether this process is a worker that ``accelerate launch`` (torchrun) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def die_with_launcher() -> bool:
    """Make this worker die when its launcher dies; True where that is arranged.

    torchrun starts each worker in a session of its own, so a kill of the launcher's
    process group (Ctrl-\\, ``kill -9 -PGID``, a job scheduler) leaves the workers running:
    they go on training and writing into the run folder, beside a resumed run. On Linux the
    kernel can send a signal to a process when its parent exits (``PR_SET_PDEATHSIG``);
    SIGKILL, so that nothing runs after the launcher is gone. Elsewhere nothing changes.
    """
    if not launched_by_torchrun() or sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the launcher died before the call: it will never signal
        os.kill(os.getpid(), signal.SIGKILL)
    return True


class Processes:
    """The processes of a run, seen through an ``accelerate.Accelerator`` (or none)."""

    def __init__(self, accelerator: Any = None) -> None:
        self.accelerator = accelerator
        self.num = int(getattr(accelerator, "num_processes", 1) or 1)
        self.index = int(getattr(accelerator, "process_index", 0) or 0)
        self.is_main = self.index == 0

    def game_seed(self, seed: int) -> int:
        return seed + self.index * PROCESS_SEED_STRIDE

    def wait(self) -> None:
        if self.num > 1:
            self.accelerator.wait_for_everyone()

    def close(self) -> None:
        """Leave the process group together, once the run is done. A process that exits
        with its group's threads still running is killed by C++ (``terminate called
        without an active exception``), and its launcher then fails the whole run."""
        if self.num > 1:
            import torch.distributed as dist

            self.wait()
            if dist.is_initialized():
                dist.destroy_process_group()

    def broadcast(self, value: Any) -> Any:
        """The main process's ``value`` (a picklable object) on every process; every
        process waits for it, so it is a barrier as well."""
        if self.num == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def gather(self, value: Any) -> list[Any]:
        """Every process's ``value`` (a JSON-able object), in process order."""
        if self.num == 1:
            return [value]
        from accelerate.utils import gather_object

        return list(gather_object([value]))

    def mean_numbers(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with every number replaced by its mean over the processes."""
        if self.num == 1:
            return row
        keys = sorted(k for k, v in row.items() if _is_number(v) and k != "iteration")
        local = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64)
        device = self.accelerator.device
        total = self.accelerator.reduce(local.to(device), reduction="sum").cpu() / self.num
        out = dict(row)
        out.update({k: float(v) for k, v in zip(keys, total.tolist(), strict=True)})
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
