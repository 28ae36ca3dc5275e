"""A run's logged peak memory is its own, not an earlier run's in the same process."""

from __future__ import annotations

import numpy as np
import pytest

from cory_rl.train import memory
from cory_rl.train.run import run_training
from tests.conftest import read_jsonl, tiny_config

BLOCK_MB = 256


def resident_block() -> np.ndarray:
    """BLOCK_MB of memory, written so that it is resident."""
    return np.ones(BLOCK_MB * 2**20 // 8)


@pytest.fixture
def resettable():
    if not memory.reset_rss_peak():
        pytest.skip("this system cannot reset the peak (no writable /proc/self/clear_refs)")


def test_the_peak_restarts_from_what_is_resident_now(resettable):
    block = resident_block()
    high = memory.rss_peak_mb()
    del block  # a large block goes back to the kernel when freed
    assert memory.reset_rss_peak()
    assert memory.rss_peak_mb() < high - BLOCK_MB / 2


def test_a_run_logs_its_own_peak_not_the_process_s(resettable, tiny_model_dir, tmp_path):
    block = resident_block()
    process_peak = memory.rss_peak_mb()
    del block
    run = run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=2))
    peaks = [row["memory/peak_mb"] for row in read_jsonl(run.path / "metrics.jsonl")]
    assert peaks and max(peaks) < process_peak - BLOCK_MB / 2
