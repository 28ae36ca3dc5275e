"""bench/gpu_check.py: its dry run takes the GPU check's path on a CPU and writes the same
JSON and report; a spent budget still writes them; the tests it runs and the wheels it
installs are the right ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]
TOP = {
    "check",
    "dry_run",
    "started",
    "code",
    "budget_s",
    "elapsed_s",
    "device",
    "setup",
    "tests",
    "models",
    "training",
    "trl",
    "skipped_for_time",
    "problems",
}
RUN = {
    "name",
    "algorithm",
    "model",
    "precision",
    "status",
    "batch_size",
    "attempts",
    "s_per_iteration",
    "rollout_s",
    "act_s",
    "learn_s",
    "generation_share",
    "act_tok_s",
    "rollout_tok_s",
    "peak_cuda_mb",
    "peak_rss_mb",
    "seconds",
}
TRAININGS = {
    f"train-{a}-{m}-{p}"
    for a in ("cory", "ppo")
    for m in ("smollm2", "gpt2-large")
    for p in ("fp32", "bf16")
}


def check(tmp_path: Path, *flags: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", *flags, "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check")
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(data) >= TOP and data["dry_run"]
    return data


@pytest.mark.bench
def test_dry_run_takes_every_step_and_writes_the_report(tmp_path):
    data = check(tmp_path, "--smoke")  # --smoke: the bench scripts' name for --dry-run
    assert data["problems"] == [] and data["skipped_for_time"] == []
    assert data["tests"]["status"] == "passed" and data["tests"]["selected"]
    assert {m["status"] for m in data["models"].values()} == {"ok"}
    assert {run["name"] for run in data["training"]} == TRAININGS
    for run in data["training"]:
        assert run["status"] == "ok" and set(run) >= RUN, run
        assert run["s_per_iteration"] > 0 and run["tokens_sampled"] > 0
    first = data["training"][0]  # out of memory simulated at batch 8: halved to 4
    assert [a["batch_size"] for a in first["attempts"]] == [8, 4] and first["batch_size"] == 4
    (trl,) = data["trl"]
    assert trl["status"] == "ok" and trl["time_ratio"] > 0 and trl["ours"] and trl["trl"]


def test_a_spent_budget_skips_every_item_and_still_writes_the_report(tmp_path):
    data = check(tmp_path, "--dry-run", "--budget", "1")
    assert "tests" in data["skipped_for_time"] and data["tests"]["status"].startswith("skipped")
    assert {run["name"] for run in data["training"]} == TRAININGS
    assert {run["status"] for run in [*data["training"], *data["trl"]]} == {"skipped (time budget)"}
    assert "skipped (time budget)" in (tmp_path / "gpu_check.md").read_text()


def test_the_tests_it_runs_are_those_that_name_cuda(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import pytest, torch\n\n"
        "@pytest.mark.skipif(not torch.cuda.is_available(), reason='no GPU')\n"
        "def test_on_gpu():\n    pass\n\n"
        "def test_plain():\n    pass\n\n"
        "class TestThings:\n    def test_device(self):\n        x = 'cuda'\n"
    )
    (tmp_path / "test_b.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "test_c.py").write_text(
        "import pytest\npytestmark = pytest.mark.cuda\n\ndef test_any():\n    pass\n"
    )
    assert gpu_check.cuda_tests(tmp_path) == [
        "tests/test_a.py::test_on_gpu",
        "tests/test_a.py::TestThings::test_device",
        "tests/test_c.py::test_any",
    ]


def test_only_the_wheels_this_python_can_install_are_taken(tmp_path):
    here = f"py{sys.version_info.major}{sys.version_info.minor}"
    names = [
        "multiprocess-0.70.19-py39-none-any.whl",
        f"multiprocess-0.70.19-{here}-none-any.whl",
        "trl-1.16.0-py3-none-any.whl",
        "pyarrow-1.0-cp27-cp27m-manylinux1_x86_64.whl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in gpu_check.wheels_for("multiprocess", tmp_path)] == [
        f"multiprocess-0.70.19-{here}-none-any.whl"
    ]
    assert [p.name for p in gpu_check.wheels_for("TRL", tmp_path)] == [
        "trl-1.16.0-py3-none-any.whl"
    ]
    assert gpu_check.wheels_for("pyarrow", tmp_path) == []


def test_the_memory_model_takes_its_bytes_from_the_measurement():
    from bench import memory_model

    weights, adam = memory_model.bytes_per_parameter()
    assert round(weights, 2) == 4.0 and round(adam, 2) == 8.0  # fp32 weights, two moments
    assert abs(memory_model.GPT2_LARGE.params - 774e6) < 1e6
    assert abs(memory_model.LLAMA2_7B.params - 6.74e9) < 0.01e9
    imdb, hh = memory_model.PRESETS["paper-imdb"], memory_model.PRESETS["paper-hh"]
    usable = memory_model.USABLE_GIB
    assert memory_model.held(imdb, "cory", 1, 256, False).peak < usable
    one = memory_model.held(hh, "cory", 1, 256, False)
    assert one.peak > usable and one.kv > one.policies + one.adam  # the KV cache does not fit
    # FSDP2 shards what is held throughout, not what each process's own games hold
    eight = memory_model.held(hh, "cory", 8, 256, False)
    assert eight.adam * 8 == pytest.approx(one.adam) and eight.kv == one.kv
