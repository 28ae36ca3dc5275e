"""Peak resident memory since a reset: a run's own peak, not its process's.

``ru_maxrss`` is the peak over the whole process, so in a sweep (run after run in one
process) every run would report the largest run before it. On Linux writing ``5`` to
``/proc/self/clear_refs`` resets the peak (``VmHWM``) to what is resident now; where that
fails the process peak is all there is. An allocator that keeps freed memory resident
for reuse (mimalloc, as the training scripts run it) keeps the earlier runs' largest
footprint resident too, so a run's peak is then its own or that, whichever is larger.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def _status_kb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def reset_rss_peak() -> bool:
    """Set the peak to the memory resident now; False where the system cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current RSS
        return True
    except OSError:
        return False


def rss_peak_mb() -> float:
    """Peak resident memory since the last reset (the process peak where resets fail)."""
    kb = _status_kb("VmHWM")
    if kb is None:
        scale = 1024 if sys.platform != "darwin" else 1024**2
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    return kb / 1024
