"""bench/bench_train.py at a toy size on a tiny model: every phase reported, positive, and
the instrumentation (bench/measure.py) leaves training's results unchanged."""

from __future__ import annotations

import pytest
import torch

import cory_rl.train.training.loop as loop
from bench import bench_train, measure
from cory_rl.train.core.build import build_game_and_learners
from tests.conftest import read_jsonl


def toy_argv(model_dir, run_dir, algorithm, *extra):
    return [
        "--model",
        model_dir,
        "--algorithm",
        algorithm,
        "--batch_size",
        "4",
        "--new_tokens",
        "3",
        "--epochs",
        "2",
        "--mini_batch_size",
        "2",
        "--iterations",
        "2",
        "--run_dir",
        str(run_dir),
        "--threads",
        "1",
        "--checkpoint_every",
        "1",
        "--sample_every",
        "1",
        *extra,
    ]


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [("cory", ["--calibrate", "--forward_batch_size", "1"]), ("ppo", ["--lora"])],
)
def test_every_phase_is_reported_with_positive_numbers(
    tiny_model_dir, tmp_path, capsys, algorithm, extra
):
    originals = (loop.play_batch, loop.CheckpointWriter.save, loop.RunDirectory.log_metrics)
    result = bench_train.main(toy_argv(tiny_model_dir, tmp_path, algorithm, *extra))[algorithm]
    out = capsys.readouterr().out
    for _, label, _ in measure.ROWS:
        assert label in out
    assert f"SUMMARY {algorithm}" in out and "model.generate" in out
    if "--calibrate" in extra:
        assert "calibration" in out
    phases = result["phases"]
    # A one-chunk mini-batch takes Adam's steps inside the backward pass (the ppo case).
    in_backward = "--forward_batch_size" not in extra
    assert ("Adam steps inside the backward pass" in out) == in_backward
    for key, _, _ in measure.ROWS:
        if not key.endswith("_rest") and not (key == "optimiser" and in_backward):
            assert phases[key].seconds > 0, key
    for key in (*measure.COMPUTE, "rollout", "learn", "iteration"):
        assert phases[key].tokens > 0 and phases[key].flops > 0, key
        assert 0 <= 1 - phases[key].real / phases[key].tokens < 1, key
    for key in ("rollout", "act", "learn", "forward", "backward", "checkpoint", "iteration"):
        assert phases[key].rss_mb > 0, key
    for key in ("peak_gflops", "generate_tok_s", "act_tok_s", "rollout_tok_s", "floor_s"):
        assert result[key] > 0, key
    # The wrappers around the loop's functions are gone afterwards.
    assert (loop.play_batch, loop.CheckpointWriter.save, loop.RunDirectory.log_metrics) == originals


def test_instrumented_run_trains_like_the_plain_loop(tiny_model_dir, tmp_path, capsys):
    """Timing wrappers only: the measured run logs the same metrics as an unmeasured one."""
    bench_train.main(toy_argv(tiny_model_dir, tmp_path / "bench", "cory"))
    capsys.readouterr()
    args = bench_train.parse_args(toy_argv(tiny_model_dir, tmp_path / "plain", "cory"))
    config = bench_train.make_config(args, "cory", tmp_path / "plain")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the bench's --threads 1
    try:
        game, learners = build_game_and_learners(config)
        loop.train(config, learners, game, tmp_path / "plain")
    finally:
        torch.set_num_threads(threads)
    measured = read_jsonl(tmp_path / "bench" / "bench-cory" / "metrics.jsonl")
    plain = read_jsonl(tmp_path / "plain" / "metrics.jsonl")
    assert len(measured) == len(plain) == 2
    for a, b in zip(measured, plain, strict=True):
        keys = [k for k in a if not k.startswith(("time/", "memory/"))]
        assert {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, abs=1e-6)
