"""Checkpoints: no code runs from a file, bad files are named, a crash never loses the last one."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cory_env
import cory_rl.train.core.checkpoint as ckpt
from cory_rl.agents.base import RandomLearner
from cory_rl.agents.state_io import CheckpointError
from cory_rl.train.commands.train import main
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config


class Payload:
    """Unpickling this writes a file: proof that a pickle ran code."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "pwned"))


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "run"
    run_training(tiny_config(tiny_model_dir, path, iterations=2, checkpoint_every=1))
    return path


def copy_run(finished_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    return target


def resume(run_path: Path, iterations: int = 3):
    config, resume_dir = parse_args(["--resume", str(run_path), "--iterations", str(iterations)])
    return run_training(config, resume_dir)


@pytest.mark.parametrize(
    "victim",
    [
        "checkpoint/llm_0/policy.safetensors",
        "checkpoint/llm_1/agent.json",
        "checkpoint/state.json",
        "checkpoint/rng.safetensors",
    ],
)
def test_a_planted_pickle_never_runs(finished_run, tmp_path, victim):
    run_path = copy_run(finished_run, tmp_path)
    proof = tmp_path / "proof.txt"
    (run_path / victim).write_bytes(pickle.dumps(Payload(proof)))
    with pytest.raises(CheckpointError, match="not a valid checkpoint file"):
        resume(run_path)
    assert not proof.exists()


def test_a_folder_holding_only_a_pickle_is_no_checkpoint(finished_run, tmp_path):
    run_path = copy_run(finished_run, tmp_path)
    proof = tmp_path / "proof.txt"
    for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
        shutil.rmtree(run_path / name, ignore_errors=True)
    (run_path / "checkpoint").mkdir()
    (run_path / "checkpoint" / "state.pt").write_bytes(pickle.dumps(Payload(proof)))
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        resume(run_path)
    assert not proof.exists()


@pytest.mark.parametrize("victim", ["llm_0/policy.safetensors", "llm_0/state.safetensors"])
def test_truncated_checkpoint_names_the_file(finished_run, tmp_path, victim, capsys):
    run_path = copy_run(finished_run, tmp_path)
    path = run_path / "checkpoint" / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"{path.name} is not a valid checkpoint file"):
        resume(run_path)
    with pytest.raises(SystemExit) as exit_info:  # the script says it in one line
        main("cory", ["--resume", str(run_path), "--iterations", "3"])
    assert "cannot be resumed from" in str(exit_info.value)


def test_run_dir_of_a_crashed_run_without_checkpoint_starts_again(tiny_model_dir, tmp_path):
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "metrics.jsonl").write_text('{"iteration": 0, "stale": true}\n')
    run = run_training(tiny_config(tiny_model_dir, crashed, iterations=1))
    assert [r.get("stale") for r in read_jsonl(run.path / "metrics.jsonl")] == [None]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        run_training(tiny_config(tiny_model_dir, a_file))


def test_resume_drops_a_half_written_log_line(finished_run, tmp_path):
    run_path = copy_run(finished_run, tmp_path)
    with (run_path / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 2, "llm_0/sco')  # the crash cut this row short
    resume(run_path)
    assert [r["iteration"] for r in read_jsonl(run_path / "metrics.jsonl")] == [0, 1, 2]


# ---------------------------------------------------------------- crash-safe swap
def small_game(tiny_tokenizer):
    task = cory_env.custom_task(
        ["the movie", "a film"], lambda q, r: [0.0] * len(r), max_new_tokens=2, context_length=16
    )
    return cory_env.batched_game(task, batch_size=2, n_agents=2, tokenizer=tiny_tokenizer)


class Crash(Exception):
    pass


def crash_at(monkeypatch, step: int) -> list[int]:
    """Make the ``step``-th rename or delete inside ``cory_rl.train.core.checkpoint`` raise
    ``Crash``."""
    calls = [0]
    real_rename, real_rmtree = Path.rename, shutil.rmtree

    def counted(real):
        def wrapper(*args, **kwargs):
            calls[0] += 1
            if calls[0] == step:
                raise Crash
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(ckpt.Path, "rename", counted(real_rename))
    monkeypatch.setattr(ckpt.shutil, "rmtree", counted(real_rmtree))
    return calls


def learners(seed: int = 0):
    return {f"llm_{i}": RandomLearner(10, seed) for i in range(2)}


def test_a_crash_at_any_step_of_the_swap_leaves_a_loadable_checkpoint(
    tiny_tokenizer, tmp_path, monkeypatch
):
    game = small_game(tiny_tokenizer)
    game.reset(seed=0)
    # Count the steps of one save.
    ckpt.save_checkpoint(tmp_path / "probe", learners(), game, 0)
    calls = crash_at(monkeypatch, step=-1)
    ckpt.save_checkpoint(tmp_path / "probe", learners(), game, 1)
    n_steps = calls[0]
    monkeypatch.undo()
    assert n_steps >= 4

    for first in range(1, n_steps + 1):
        for second in [None, *range(1, n_steps + 1)]:
            run = tmp_path / f"run-{first}-{second}"
            ckpt.save_checkpoint(run, learners(), game, 4)
            crash_at(monkeypatch, step=first)
            with pytest.raises(Crash):
                ckpt.save_checkpoint(run, learners(), game, 5)
            monkeypatch.undo()
            assert ckpt.load_checkpoint(run, learners(), small_game(tiny_tokenizer)) in (5, 6)
            if second is not None:  # a second crash while saving from the restored state
                crash_at(monkeypatch, step=second)
                with pytest.raises(Crash):
                    ckpt.save_checkpoint(run, learners(), game, 6)
                monkeypatch.undo()
                next_it = ckpt.load_checkpoint(run, learners(), small_game(tiny_tokenizer))
                assert next_it in (5, 6, 7), (first, second)


def test_checkpoint_restores_game_and_rngs(tiny_tokenizer, tmp_path):
    game = small_game(tiny_tokenizer)
    game.reset(seed=3)
    np.random.seed(7)
    ckpt.save_checkpoint(tmp_path, learners(), game, 0)
    game.reset()
    expected = ([q.text for q in game.queries], np.random.rand())
    fresh = small_game(tiny_tokenizer)
    np.random.seed(99)
    assert ckpt.load_checkpoint(tmp_path, learners(), fresh) == 1
    fresh.reset()
    assert ([q.text for q in fresh.queries], np.random.rand()) == expected


def test_tensorboard_holds_each_iteration_once_after_a_crash_and_resume(tiny_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_path = tmp_path / "run"
    run_training(tiny_config(tiny_model_dir, run_path, iterations=2, checkpoint_every=1))
    shutil.copytree(run_path / "checkpoint", tmp_path / "after-iteration-1")
    resume(run_path, iterations=3)  # logs iteration 2, then checkpoints it
    # A crash after iteration 2 was logged but before its checkpoint landed:
    shutil.rmtree(run_path / "checkpoint")
    shutil.copytree(tmp_path / "after-iteration-1", run_path / "checkpoint")
    resume(run_path, iterations=3)  # iteration 2 again
    events = EventAccumulator(str(run_path / "tensorboard"))
    events.Reload()
    steps = [e.step for e in events.Scalars("llm_0/score")]
    assert steps == [0, 1, 2]
    assert [r["iteration"] for r in read_jsonl(run_path / "metrics.jsonl")] == [0, 1, 2]


# ---------------------------------------------------------------- background writes
def test_tensor_files_are_the_bytes_safetensors_writes(tmp_path):
    from safetensors.torch import save

    from cory_rl.agents import state_io

    tensors = {
        "weight": torch.randn(3, 5),
        "half": torch.randn(4).bfloat16(),
        "step": torch.tensor(7.0),
        "empty": torch.zeros(0, 2),
        "ids": torch.arange(5, dtype=torch.int64),
        "rng": torch.arange(11, dtype=torch.uint8),
        "flags": torch.tensor([True, False, True]),
        "double": torch.randn(2, dtype=torch.float64),
        "small": torch.arange(3, dtype=torch.int16),
        "fp16": torch.randn(3).half(),
        "i32": torch.arange(4, dtype=torch.int32),
        "i8": torch.arange(-2, 2, dtype=torch.int8),
    }
    metadata = {"cory.aliases": "{}"}
    state_io.write_safetensors(tensors, tmp_path / "ours.safetensors", metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == save(tensors, metadata=metadata)
    loaded = state_io.load_tensors(tmp_path / "ours.safetensors")
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_queued_writes_keep_the_values_and_order_of_the_calls(tmp_path):
    from cory_rl.agents import state_io

    weights, config = torch.zeros(3), {"lr": 1.0}
    queue = state_io.WriteQueue()
    state_io.save_json(config, tmp_path / "a.json", queue)
    state_io.save_tensors({"w": weights}, tmp_path / "w.safetensors", queue)
    assert len(queue) == 2 and not list(tmp_path.iterdir())  # nothing written yet
    config["lr"] = 2.0  # JSON is taken at the call
    queue[0]()
    queue[1]()
    assert state_io.load_json(tmp_path / "a.json") == {"lr": 1.0}
    assert torch.equal(state_io.load_tensors(tmp_path / "w.safetensors")["w"], weights)
    state_io.save_json(config, tmp_path / "b.json")  # no queue: written at once
    assert (tmp_path / "b.json").exists()


class CountingLearner(RandomLearner):
    """Its weights count its updates, so a checkpoint shows which update it caught."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size)
        self.weights = torch.zeros(1000)

    def learn(self) -> dict[str, float]:
        self.weights += 1  # in place, as an optimiser step is
        return {}

    def save(self, path: Path, writer=None) -> None:
        from cory_rl.agents import state_io

        super().save(path)
        state_io.save_tensors({"weights": self.weights}, Path(path) / "weights.safetensors")


def test_the_loop_waits_for_the_checkpoint_before_learning(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    """A slow disk: each checkpoint must still hold the weights of the iteration it saves."""
    import time

    from cory_rl.agents import state_io
    from cory_rl.train.training.loop import train

    real_write = state_io.write_safetensors
    landed: list[float] = []

    def slow_write(tensors, path, metadata):
        time.sleep(0.3)  # the next rollout runs meanwhile
        real_write(tensors, path, metadata)
        if "weights" in tensors:
            landed.append(float(state_io.load_tensors(path)["weights"][0]))

    monkeypatch.setattr(state_io, "write_safetensors", slow_write)
    game = small_game(tiny_tokenizer)
    learners_ = {f"llm_{i}": CountingLearner(10) for i in range(2)}
    config = tiny_config(tiny_model_dir, tmp_path / "run", iterations=3, checkpoint_every=1)
    train(config, learners_, game, tmp_path / "run")
    assert landed == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]  # both seats, after updates 1, 2, 3
    saved = state_io.load_tensors(tmp_path / "run/checkpoint/llm_0/weights.safetensors")
    assert float(saved["weights"][0]) == 3.0


def test_a_failed_background_write_is_raised_and_the_last_checkpoint_survives(
    tiny_tokenizer, tmp_path, monkeypatch
):
    from cory_rl.agents import state_io

    game = small_game(tiny_tokenizer)
    game.reset(seed=0)
    writer = ckpt.CheckpointWriter()
    writer.save(tmp_path, learners(), game, 0)
    writer.wait()

    def full_disk(tensors, path, metadata):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_io, "write_safetensors", full_disk)
    writer.save(tmp_path, learners(), game, 1)  # returns: the error comes from the thread
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.wait()  # raised once, then the writer is usable again
    monkeypatch.undo()
    assert ckpt.load_checkpoint(tmp_path, learners(), small_game(tiny_tokenizer)) == 1


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities: Linux only")
def test_the_writer_thread_yields_the_cpu_to_the_loop_and_only_itself():
    import threading

    seen = []

    def probe() -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    writer = ckpt.CheckpointWriter()
    writer._thread = threading.Thread(target=writer._run, args=([probe],))
    writer._thread.start()
    writer.wait()
    assert seen == [19]  # the writes ran at the lowest priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
