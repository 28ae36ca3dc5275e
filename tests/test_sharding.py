"""FSDP2 for every seat (agents/sharding.py): 2 CPU processes over gloo, the tiny model.

A sharded update equals the one-process update; a 2-process run killed while it writes a
checkpoint (its launcher, or one worker) leaves no process behind and, resumed, logs what
one run straight through logs; a live run's folder is refused to a second run; export
gathers weights that transformers alone loads; CORY, LoRA CORY and a critic-free learner
each train under FSDP2.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import read_jsonl, tiny_config
from tests.sharding_worker import seeded_update

ROOT = Path(__file__).resolve().parents[1]
FSDP2 = ROOT / "train" / "configs" / "fsdp2.yaml"  # the config the README ships
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_command(script: Path, *args: str, config: Path = FSDP2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(free_port()),
        str(script),
        *args,
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run(command: list[str], timeout: int = 600) -> None:
    done = subprocess.run(
        command, env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-4000:]


def train_command(config_file: Path, *flags: str, config: Path = FSDP2) -> list[str]:
    return launch_command(
        ROOT / "train" / "cory.py", "--config", str(config_file), *flags, config=config
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_sharded_update_equals_the_one_process_update(tiny_model_dir, tmp_path, lora):
    # CORY: two seats, each its own policy (full) or adapter on one shared base (LoRA).
    # Score scaling off: its running std over both processes' (identical) batches counts
    # twice the answers, a data-parallel difference, not a sharding one.
    learner = {
        "max_grad_norm": 0.5,
        "mini_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "score_scaling": False,
    }
    config = tiny_config(
        tiny_model_dir, tmp_path / "run", batch_size=4, lora=lora, lora_r=4, learner=learner
    )
    config_file = tmp_path / "config.yaml"
    config.save(config_file)
    run(
        launch_command(
            ROOT / "tests" / "sharding_worker.py", str(config_file), str(tmp_path / "fsdp2")
        )
    )
    seeded_update(str(config_file), tmp_path / "one")
    sharded = json.loads((tmp_path / "fsdp2" / "stats.json").read_text())
    one = json.loads((tmp_path / "one" / "stats.json").read_text())
    assert all(sharded["sharded"].values()) and not any(one["sharded"].values())
    for agent, stats in one["stats"].items():
        assert sorted(sharded["stats"][agent]) == sorted(stats)
        for key, value in stats.items():
            assert sharded["stats"][agent][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        assert stats["ppo/grad_norm"] > 0 and one["moved"][agent] > 1e-4  # the update moved it
        before = load_file(str(tmp_path / "one" / f"{agent}.safetensors"))
        after = load_file(str(tmp_path / "fsdp2" / f"{agent}.safetensors"))
        assert sorted(before) == sorted(after)
        for name, tensor in before.items():
            atol = ADAM_STEP_SHARE * config.learner["learning_rate"]
            torch.testing.assert_close(after[name], tensor, rtol=0, atol=atol, msg=name)


ADAM_STEP_SHARE = 1e-2
"""Weights after the update agree to 1% of one Adam step (the learning rate, 1e-3). Adam moves
a weight by about ``lr * m / sqrt(v)``, a ratio of its gradients that does not shrink with
them: a weight whose gradient is small is moved as far as any, by a ratio whose rounding
error is the gradient's relative one. Summing the same terms in another order (a shard's
all-reduce, or one process splitting its micro-batch differently) leaves that error at 1e-7
of the largest terms, so a weight whose gradient is 1e-4 of them moves lr * 1e-3 apart: 1e-6
at this learning rate. Measured on the full case: FSDP2 against one process 4.9e-7, one
process against itself with forward_batch_size 1 3.8e-7, and past 1e-6 on other CPUs. A
sharding error (a shard in the wrong place, moments of the wrong parameter) moves weights by
a whole step (1e-3)."""


def processes_of(marker: str) -> dict[int, dict[str, str]]:
    """The live processes whose command line holds ``marker``: pid -> environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                entries = (proc / "environ").read_bytes().split(b"\0")
                found[int(proc.name)] = dict(
                    e.decode(errors="replace").partition("=")[::2] for e in entries if b"=" in e
                )
        except OSError:  # it ended while we looked
            continue
    return found


KILLS = {
    # a kill of the launcher's process group (a terminal's kill -9 -PGID, a scheduler):
    # torchrun starts each worker in a session of its own, out of that group
    "fsdp2-launcher": (FSDP2, "launcher"),
    # one worker dies alone (out of memory, a node lost): the launcher stops the other
    "ddp-worker": (ROOT / "train" / "configs" / "multi_cpu.yaml", "worker"),
}


@pytest.mark.parametrize("kill", list(KILLS))
def test_a_run_killed_while_it_writes_a_checkpoint_resumes_as_if_never_stopped(
    tiny_model_dir, tmp_path, kill
):
    """Killed while ``checkpoint.tmp`` is being written (or, should the writes of the tiny
    model be too quick to see, between two of them), then resumed: no process of the
    killed run lives on, and the resumed run logs what a run straight through logs."""
    launch_config, victim = KILLS[kill]
    config = tiny_config(
        tiny_model_dir, tmp_path / "straight", iterations=8, checkpoint_every=1, report_to=["none"]
    )
    straight = tmp_path / "straight.yaml"
    config.save(straight)
    run(train_command(straight, config=launch_config))
    config.run_dir = str(tmp_path / "killed")
    killed = tmp_path / "killed.yaml"
    config.save(killed)
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            train_command(killed, config=launch_config),
            env=environment(),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def said() -> str:
        """The killed run's last words, for a failure's message."""
        return "the killed run said:\n" + log.read_text(errors="replace")[-4000:]

    run_dir = tmp_path / "killed"
    marker, writing = run_dir / "checkpoint" / "state.json", run_dir / "checkpoint.tmp"
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        done = json.loads(marker.read_text())["iteration"] if marker.exists() else -1
        if (done >= 1 and writing.exists()) or done >= 4:
            break
        time.sleep(0.002)
    if victim == "launcher":
        os.killpg(process.pid, signal.SIGKILL)
    else:
        rank_1 = [pid for pid, env in processes_of(str(killed)).items() if env.get("RANK") == "1"]
        assert rank_1, f"no worker of rank 1 found; {said()}"
        os.kill(rank_1[0], signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10  # the launcher stops a lone survivor within seconds
    while processes_of(str(killed)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_of(str(killed)), f"processes of the killed run live on; {said()}"
    stopped_at = json.loads(marker.read_text())["iteration"]
    assert stopped_at < config.iterations - 1, f"the run ended before it was killed; {said()}"
    run(launch_command(ROOT / "train" / "cory.py", "--resume", str(run_dir), config=launch_config))
    rows = [read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("straight", "killed")]
    assert [r["iteration"] for r in rows[1]] == [r["iteration"] for r in rows[0]]
    for a, b in zip(*rows, strict=True):
        for key, value in a.items():
            if key.startswith(("time/", "memory/")) or not isinstance(value, float):
                continue
            assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (a["iteration"], key)
    samples = [(tmp_path / name / "samples.jsonl").read_text() for name in ("straight", "killed")]
    assert samples[1] == samples[0]
    assert not writing.exists() and not (run_dir / "checkpoint.old").exists()
    if kill != "fsdp2-launcher":
        return
    # export (one process) gathers nothing more: the checkpoint holds whole weights
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    run([sys.executable, "train/export.py", str(run_dir), str(out)])
    saved = load_file(str(run_dir / "checkpoint" / "llm_1" / "policy.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(out / "llm_1")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, saved[f"lm.{name}"], rtol=0, atol=0, msg=name)


def test_a_second_run_on_a_folder_that_a_live_run_writes_is_refused(tiny_model_dir, tmp_path):
    """The folder lock: while a run holds its folder, a resume of it (or a new run there)
    stops in one line before it loads anything; once the run has ended, the resume works."""
    config = tiny_config(tiny_model_dir, tmp_path / "run", iterations=2, report_to=["none"])
    from cory_rl.train.core.run_folder import RunLock

    (tmp_path / "run").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from cory_rl.train.core.run_folder import RunLock; "
                f"lock = RunLock({str(tmp_path / 'run')!r}); "
                "print('held', flush=True); time.sleep(60)"
            ),
        ],
        env=environment(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        config.save(tmp_path / "config.yaml")
        done = subprocess.run(
            [sys.executable, "train/cory.py", "--config", str(tmp_path / "config.yaml")],
            env=environment(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
        assert "is being written by a run that is still going" in done.stderr
        assert not (tmp_path / "run" / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()
    RunLock(tmp_path / "run").release()  # the kernel released it with the process


@pytest.mark.parametrize(
    ("algorithm", "lora"), [("cory", True), ("grpo", False)], ids=["lora-cory", "grpo"]
)
def test_lora_cory_and_a_critic_free_learner_train_under_fsdp2(
    tiny_model_dir, tmp_path, algorithm, lora
):
    overrides = {"lora": True, "lora_r": 4} if lora else {"group_size": 2}
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        algorithm=algorithm,
        iterations=2,
        eval_every=1,
        eval_queries=4,
        eval_samples=1,
        report_to=["none"],
        **overrides,
    )
    config_file = tmp_path / "config.yaml"
    config.save(config_file)
    run(train_command(config_file))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    trained = [r for r in rows if "games" in r]
    assert [r["iteration"] for r in trained] == [0, 1]
    assert trained[0]["games"] == 2 * config.batch_size
    assert len(list((tmp_path / "run" / "evals").glob("updates_*.json*"))) == 3
    if lora:  # each seat's adapter, as peft writes it: it loads with transformers and peft
        from transformers import AutoModelForCausalLM

        out = tmp_path / "export"
        run([sys.executable, "train/export.py", str(tmp_path / "run"), str(out)])
        model = AutoModelForCausalLM.from_pretrained(out / "llm_0")
        assert any("lora_" in name for name, _ in model.named_parameters())


def test_two_nodes_on_one_address_train_as_one_machine_with_two_processes(tiny_model_dir, tmp_path):
    """The several-machine recipe (docs/scale.md), as two machines of one process each on
    127.0.0.1: both finish, and they log what one machine with two processes logs (process
    p plays the games of seed + p * stride wherever it runs)."""
    config = tiny_config(tiny_model_dir, tmp_path / "one", iterations=2, report_to=["none"])
    config.save(tmp_path / "one.yaml")
    run(train_command(tmp_path / "one.yaml"))
    config.run_dir = str(tmp_path / "two")
    config.save(tmp_path / "two.yaml")
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(FSDP2),
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--num_processes",
                "2",
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                port,
                str(ROOT / "train" / "cory.py"),
                "--config",
                str(tmp_path / "two.yaml"),
            ],
            env=environment(),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        _, errors = node.communicate(timeout=600)
        assert node.returncode == 0, errors[-4000:]
    rows = [read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("one", "two")]
    assert [r["iteration"] for r in rows[1]] == [0, 1] and rows[1][0]["games"] == 8
    for a, b in zip(*rows, strict=True):
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith(("time/", "memory/")):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (a["iteration"], key)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sharded_seats_send_whole_weights_to_a_vllm_server(tiny_model_dir, tmp_path, lora):
    """Two FSDP2 processes against a stand-in ``vllm serve``: every process gathers its
    seat's weights (or adapter), the main one alone sends them, whole, once per version."""
    from tests.test_engine_server_http import FakeServer

    server = FakeServer(model=tiny_model_dir, max_model_len=128, lora_rank=4 if lora else None)
    server.vocab = 40  # its answers count up through the tiny model's vocabulary
    try:
        port = int(server.url.rsplit(":", 1)[1])
        config = tiny_config(
            tiny_model_dir,
            tmp_path / "run",
            iterations=2,
            report_to=["none"],
            rollout_engine="vllm",
            vllm_mode="server",
            vllm_server_port=port,
            lora=lora,
            lora_r=4,
        )
        config.save(tmp_path / "config.yaml")
        run(train_command(tmp_path / "config.yaml"))
    finally:
        server.close()
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    paths = server.paths()
    if lora:  # the base once, whole, then each seat's adapter per version (2 seats x 2 its)
        assert len(server.reloaded) == 1 and paths.count("/v1/load_lora_adapter") == 4
    else:  # each seat's whole weights, before each of its 2 turns
        assert len(server.reloaded) == 4
    for sent in server.reloaded:
        for name, tensor in whole.items():
            assert sent[name].shape == tensor.shape, name  # whole, not a process's shard
    torch.testing.assert_close(server.reloaded[0]["model.norm.weight"], whole["model.norm.weight"])
