"""A run's logged peak memory is its own, not an earlier run's in the same process."""

from __future__ import annotations

import mmap

import pytest

from cory_rl.train.core import memory
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config

BLOCK_MB = 256


def resident_block() -> mmap.mmap:
    """BLOCK_MB of memory of its own mapping, written so that it is resident. Its own
    mapping, not the heap's: ``close()`` unmaps it, so it leaves the process at once,
    whatever the allocator keeps (a heap may hold a freed block for reuse)."""
    block = mmap.mmap(-1, BLOCK_MB * 2**20)
    page = b"\1" * mmap.PAGESIZE
    for _ in range(len(block) // mmap.PAGESIZE):
        block.write(page)
    return block


@pytest.fixture
def resettable():
    if not memory.reset_rss_peak():
        pytest.skip("this system cannot reset the peak (no writable /proc/self/clear_refs)")


def test_the_peak_restarts_from_what_is_resident_now(resettable):
    block = resident_block()
    high = memory.rss_peak_mb()
    block.close()
    assert memory.reset_rss_peak()
    assert memory.rss_peak_mb() < high - BLOCK_MB / 2


def test_a_run_logs_its_own_peak_not_the_process_s(resettable, tiny_model_dir, tmp_path):
    block = resident_block()
    process_peak = memory.rss_peak_mb()
    block.close()
    run = run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=2))
    peaks = [row["memory/peak_mb"] for row in read_jsonl(run.path / "metrics.jsonl")]
    assert peaks and max(peaks) < process_peak - BLOCK_MB / 2
