"""The heap allocator: when a script re-executes itself on mimalloc, and that it then runs
on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cory_rl.train.config import allocator

LIB = Path("/somewhere/libmimalloc.so")


def test_system_and_a_missing_library_leave_the_process_as_it_is():
    assert allocator.relaunch_environment("system", {}, LIB) is None
    assert allocator.relaunch_environment("auto", {}, None) is None
    assert allocator.relaunch_environment("auto", {}, LIB, platform="darwin") is None


def test_mimalloc_asked_for_but_missing_is_an_error_that_says_how_to_fix_it():
    with pytest.raises(RuntimeError, match="pip install cmeel-mimalloc"):
        allocator.relaunch_environment("mimalloc", {}, None)
    with pytest.raises(ValueError, match="got 'jemalloc'"):
        allocator.relaunch_environment("jemalloc", {}, LIB)


def test_the_relaunch_preloads_mimalloc_without_purging_and_keeps_other_preloads():
    env = allocator.relaunch_environment("auto", {"LD_PRELOAD": "libother.so", "X": "1"}, LIB)
    assert env["LD_PRELOAD"] == f"{LIB} libother.so"
    assert env["MIMALLOC_PURGE_DELAY"] == "-1"
    assert env["X"] == "1" and env[allocator.RELAUNCHED] == "1"
    lean = allocator.relaunch_environment("auto", {}, LIB, lean=True)
    assert lean["MIMALLOC_PURGE_DELAY"] == "10000"  # a memory-saving run hands idle pages back
    mine = allocator.relaunch_environment("mimalloc", {"MIMALLOC_PURGE_DELAY": "10"}, LIB)
    assert mine["MIMALLOC_PURGE_DELAY"] == "10"  # the user's own setting wins


def test_a_process_already_on_mimalloc_or_relaunched_once_is_not_relaunched_again():
    assert allocator.relaunch_environment("auto", {"LD_PRELOAD": str(LIB)}, LIB) is None
    assert allocator.relaunch_environment("auto", {allocator.RELAUNCHED: "1"}, LIB) is None


def test_auto_leaves_an_allocator_the_user_preloaded_and_mimalloc_overrides_it():
    mine = {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert allocator.relaunch_environment("auto", mine, LIB) is None
    forced = allocator.relaunch_environment("mimalloc", mine, LIB)
    assert forced["LD_PRELOAD"].startswith(str(LIB))


def test_the_setting_is_found_among_a_sweeps_training_flags():
    assert allocator.setting_in(["--lora", "true", "--allocator", "system"]) == "system"
    assert allocator.setting_in(["--allocator=mimalloc"]) == "mimalloc"
    assert allocator.setting_in(["--batch_size", "8"]) == "auto"


@pytest.mark.parametrize("setting", ["auto", "system"])
def test_a_relaunched_script_runs_on_the_allocator_it_asked_for(setting, tmp_path):
    if sys.platform != "linux" or allocator.mimalloc_library() is None:
        pytest.skip("mimalloc is installed on Linux only")
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\nfrom cory_rl.train.config import allocator\n"
        "allocator.relaunch(sys.argv[1])\nprint(allocator.in_use(), sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.RELAUNCHED)}
    out = subprocess.run(
        [sys.executable, str(script), setting, "--flag"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    expected = "mimalloc" if setting == "auto" else "system"
    assert out.strip() == f"{expected} ['{setting}', '--flag']"  # same arguments, run once
