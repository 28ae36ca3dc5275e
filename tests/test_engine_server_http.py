"""The vLLM server engine (agents/engine_server.py) against a stand-in server: what it asks,
when it sends weights, and how it fails. Runs without vLLM; tests/test_engine_server.py
runs the real ``vllm serve``."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cory_env.checks import SettingError
from cory_rl.agents.engine import SamplingSettings
from cory_rl.agents.engine_serve import serve_command
from cory_rl.agents.engine_server import ServerError, VLLMServerEngine

MODEL = "/models/tiny"


class FakeServer:
    """Answers as ``vllm serve`` does, as far as the engine asks; records every request.
    A completion is the prompt's last id, then ids counting up from the seed, ending
    with EOS where the budget allows it."""

    def __init__(
        self,
        model: str = MODEL,
        max_model_len: int = 64,
        dev_mode: bool = True,
        logprobs_mode: str = "processed_logprobs",
        lora_rank: int | None = None,
        runtime_lora: bool = True,
        delay: float = 0.0,
    ) -> None:
        self.model, self.max_model_len, self.dev_mode = model, max_model_len, dev_mode
        self.logprobs_mode, self.lora_rank, self.runtime_lora = (
            logprobs_mode,
            lora_rank,
            runtime_lora,
        )
        self.delay = delay
        self.vocab = 1000  # completions' ids count modulo this
        self.requests: list[tuple[str, object]] = []
        self.reloaded: list[dict[str, torch.Tensor] | str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append((self.path, None))
                self.answer(*fake.get(self.path))

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"null")
                fake.requests.append((self.path, body))
                self.answer(*fake.post(self.path, body))

            def answer(self, status: int, content: object) -> None:
                raw = json.dumps(content).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def get(self, path: str) -> tuple[int, object]:
        if path == "/health":
            return 200, None
        if path == "/v1/models":
            entry = {
                "id": self.model,
                "root": self.model,
                "parent": None,
                "max_model_len": self.max_model_len,
            }
            return 200, {"data": [entry]}
        if path.startswith("/server_info") and self.dev_mode:
            lora = None if self.lora_rank is None else {"max_lora_rank": self.lora_rank}
            config = {"model_config": {"logprobs_mode": self.logprobs_mode}, "lora_config": lora}
            return 200, {"vllm_config": config}
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: dict) -> tuple[int, object]:
        if path == "/v1/completions":
            time.sleep(self.delay)
            loaded = [b["lora_name"] for p, b in self.requests if p == "/v1/load_lora_adapter"]
            known = {self.model, *loaded}
            if body["model"] not in known:
                return 404, {"error": {"message": f"The model `{body['model']}` does not exist."}}
            counted = [(body["seed"] + i) % self.vocab for i in range(body["max_tokens"])]
            ids = [(body["prompt"] or [3])[-1], *counted]
            ids = ids[: body["max_tokens"] - 1] + body["stop_token_ids"]
            logprobs = {"token_logprobs": [-0.5] * len(ids)}
            return 200, {"choices": [{"token_ids": ids, "logprobs": logprobs}]}
        if path == "/collective_rpc" and self.dev_mode:
            folder = Path(body["kwargs"]["weights_path"])
            file = folder / "model.safetensors"
            self.reloaded.append(load_file(file) if file.exists() else str(folder))
            return 200, {"results": [None]}
        if path == "/reset_prefix_cache" and self.dev_mode:
            return 200, {"success": True}
        if path.endswith("_lora_adapter") and self.runtime_lora:
            if path == "/v1/unload_lora_adapter" and body["lora_name"] == "cory-probe":
                return 404, {"error": {"message": "The lora adapter 'cory-probe' cannot be found."}}
            return 200, "Success"
        return 404, {"detail": "Not Found"}

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


@pytest.fixture()
def server(request):
    fake = FakeServer(**getattr(request, "param", {}))
    yield fake
    fake.close()


def engine_of(server: FakeServer, **kwargs) -> VLLMServerEngine:
    return VLLMServerEngine(server.url, MODEL, max_model_len=64, timeout=5, **kwargs)


class Seat:
    """A stand-in owner of weights."""

    def __init__(self, value: float) -> None:
        self.weights = {"w": torch.full((2, 2), value), "tied": torch.zeros(3)}
        self.weights["tied_too"] = self.weights["tied"]  # tied: written twice

    def pairs(self):
        return iter(self.weights.items())


def test_a_batch_is_one_request_per_game_with_every_sampling_setting(server):
    engine = engine_of(server)
    sampling = SamplingSettings(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.1)
    out = engine.generate([[5, 6], [7]], [3, 4], sampling, seeds=[10, 20], eos_token_id=1)
    assert out.tokens == [[6, 10, 1], [7, 20, 21, 1]]
    assert out.logprobs == [[-0.5] * 3, [-0.5] * 4]
    bodies = sorted(
        (b for p, b in server.requests if p == "/v1/completions"), key=lambda b: b["seed"]
    )
    assert [b["prompt"] for b in bodies] == [[5, 6], [7]]
    assert [(b["max_tokens"], b["seed"]) for b in bodies] == [(3, 10), (4, 20)]
    for b in bodies:  # every setting spelled out: the server's defaults never apply
        assert b["model"] == MODEL and b["stop_token_ids"] == [1] and b["logprobs"] == 0
        assert (b["temperature"], b["top_k"], b["top_p"], b["repetition_penalty"]) == (
            0.7,
            5,
            0.9,
            1.1,
        )
        assert (b["min_p"], b["presence_penalty"], b["frequency_penalty"]) == (0, 0, 0)
        assert b["return_token_ids"] is True


def test_weights_go_to_the_server_once_per_version(server):
    engine, seat = engine_of(server), Seat(1.0)
    engine.hold(seat, 0, seat.pairs)
    engine.hold(seat, 0, seat.pairs)  # unchanged: not sent again
    assert server.paths().count("/collective_rpc") == 1
    assert server.paths()[-1] == "/reset_prefix_cache"  # cached prompts of old weights go
    sent = server.reloaded[-1]
    assert torch.equal(sent["w"], seat.weights["w"]) and set(sent) == set(seat.weights)
    first = engine._folder
    seat.weights["w"] += 1
    engine.hold(seat, 1, seat.pairs)
    assert server.paths().count("/collective_rpc") == 2 and engine.reloads == 2
    assert torch.equal(server.reloaded[-1]["w"], torch.full((2, 2), 2.0))
    assert not first.exists() and engine._folder.exists()  # the server reads the new one
    other = Seat(5.0)
    engine.hold(other, 1, other.pairs)  # another seat, same version number: sent
    assert server.paths().count("/collective_rpc") == 3


def test_only_the_main_process_sends_and_every_process_waits_for_it(server):
    shared = []

    def share(value):
        shared.append(value)
        return value

    engine, seat = engine_of(server, is_main=False, share=share), Seat(1.0)
    taken = []
    engine.hold(seat, 0, lambda: taken.append(1) or seat.pairs())
    assert taken == [1], "every process takes the weights (a sharded seat gathers them)"
    assert "/collective_rpc" not in server.paths()
    assert shared[-1] is None  # the main process's word, waited for
    failing = engine_of(server, is_main=False, share=lambda value: "the server refused it")
    with pytest.raises(ServerError, match="the server refused it"):
        failing.hold(seat, 0, seat.pairs)  # the main process's failure, raised everywhere


@pytest.mark.parametrize("server", [{"lora_rank": 8}], indirect=True)
def test_a_lora_seat_sends_its_adapter_under_a_new_name_per_version(server):
    base = Seat(3.0)
    engine = engine_of(server, lora_rank=8, base_weights=base.pairs)
    assert engine.adapters
    saved = []

    def save(folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        saved.append(folder)

    seat = object()
    engine.hold_adapter(seat, 0, save)
    engine.hold_adapter(seat, 0, save)
    assert len(saved) == 1
    loads = [b for p, b in server.requests if p == "/v1/load_lora_adapter"]
    assert len(server.reloaded) == 1  # the seats' base first, whatever the server held
    assert torch.equal(server.reloaded[0]["w"], base.weights["w"])
    assert [b["lora_path"] for b in loads] == [str(saved[0])]
    engine.generate([[3]], [2], SamplingSettings(), [0], 1)
    assert server.requests[-1][1]["model"] == loads[0]["lora_name"]
    engine.hold_adapter(seat, 1, save)
    loads = [b for p, b in server.requests if p == "/v1/load_lora_adapter"]
    unloads = [b["lora_name"] for p, b in server.requests if p == "/v1/unload_lora_adapter"]
    assert loads[1]["lora_name"] != loads[0]["lora_name"] and unloads[-1] == loads[0]["lora_name"]
    assert not saved[0].exists() and saved[1].exists()
    assert len(server.reloaded) == 1  # the base is sent once only


def test_a_server_that_is_down_is_one_line():
    fake = FakeServer()
    url = fake.url
    fake.close()
    start = time.monotonic()
    with pytest.raises(ServerError, match=f"no vLLM server answers at {url}"):
        VLLMServerEngine(url, MODEL, max_model_len=64, timeout=1)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("server", [{"delay": 3.0}], indirect=True)
def test_a_slow_server_is_one_line(server):
    engine = VLLMServerEngine(server.url, MODEL, max_model_len=64, timeout=1)
    with pytest.raises(ServerError, match=r"did not answer /v1/completions within 1 s"):
        engine.generate([[3]], [2], SamplingSettings(), [0], 1)


@pytest.mark.parametrize(
    "server, match",
    [
        ({"model": "/models/other"}, "serves '/models/other', not the seats' model"),
        ({"max_model_len": 32}, "--max-model-len 64"),
        ({"dev_mode": False}, "VLLM_SERVER_DEV_MODE=1"),
        ({"logprobs_mode": "raw_logprobs"}, "--logprobs-mode processed_logprobs"),
    ],
    indirect=["server"],
)
def test_a_server_that_cannot_serve_this_engine_is_refused_before_any_turn(server, match):
    with pytest.raises(ServerError, match=match) as err:
        engine_of(server)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "server, match",
    [
        ({}, "takes no LoRA adapters"),
        ({"lora_rank": 4}, "--max-lora-rank 8"),
        ({"lora_rank": 8, "runtime_lora": False}, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
    ],
    indirect=["server"],
)
def test_a_server_that_cannot_take_the_adapters_is_refused(server, match):
    with pytest.raises(ServerError, match=match):
        engine_of(server, lora_rank=8, base_weights=Seat(0.0).pairs)


def test_the_command_says_how_to_start_the_server():
    full = serve_command("/m", port=9000, max_model_len=128)
    assert full.startswith("VLLM_SERVER_DEV_MODE=1 vllm serve /m --host 127.0.0.1 --port 9000")
    assert "--logprobs-mode processed_logprobs" in full and "--max-model-len 128" in full
    lora = serve_command("/m", lora_rank=16, max_loras=2)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in lora
    assert "--enable-lora --max-lora-rank 16 --max-loras 2" in lora


# ---------------------------------------------------------------- through the config


def test_the_server_settings_are_checked(tiny_model_dir, tmp_path):
    from tests.conftest import tiny_config

    for bad, match in [
        ({"vllm_mode": "remote"}, "vllm_mode"),
        ({"vllm_mode": "server"}, "takes effect with rollout_engine vllm"),
        ({"vllm_server_port": 70000}, "vllm_server_port"),
        ({"vllm_server_base_url": "localhost:8000"}, "vllm_server_base_url"),
        ({"vllm_server_timeout": 0}, "vllm_server_timeout"),
    ]:
        with pytest.raises(SettingError, match=match):
            tiny_config(tiny_model_dir, tmp_path / "run", **bad).validate()


def test_a_server_run_plays_its_turns_from_the_server(tiny_model_dir, tmp_path):
    """``vllm_mode: server`` builds the server engine (no vLLM in this process) and a
    batch is played from the server's answers, scored by the learner."""
    from cory_rl.train.core.build import build_game_and_learners
    from cory_rl.train.training.loop import play_batch
    from tests.conftest import tiny_config

    fake = FakeServer(model="tiny", max_model_len=512)
    try:
        config = tiny_config(
            tiny_model_dir,
            tmp_path / "run",
            "ppo",
            rollout_engine="vllm",
            vllm_mode="server",
            vllm_server_base_url=fake.url,
            max_new_tokens=4,
        )
        with pytest.raises(SettingError, match="serves 'tiny', not the seats' model"):
            build_game_and_learners(config)
        fake.model, fake.vocab = tiny_model_dir, 40
        game, learners = build_game_and_learners(config)
        learner = learners["llm_0"]
        assert isinstance(learner.engine_seat.engine, VLLMServerEngine)
        game.reset(seed=0)
        play_batch(game, learners)
        assert "/collective_rpc" in fake.paths()  # the weights before the first turn
        assert fake.paths().count("/v1/completions") == config.batch_size
        rollout = learner.rollout
        assert rollout.engine_logprobs is not None and bool((rollout.mask.sum(1) > 0).all())
        assert "engine/is_ratio_mean" in learner.learn()
    finally:
        fake.close()


def test_several_processes_may_share_a_server(tiny_model_dir, tmp_path, monkeypatch):
    """The in-process engine is refused under accelerate launch; a server is not (here it
    is down, which is the error that comes)."""
    from cory_rl.train.training import run
    from tests.conftest import tiny_config

    class TwoProcesses(run.Processes):
        def __init__(self, accelerator=None):
            super().__init__(accelerator)
            self.num = 2

    monkeypatch.setattr(run, "Processes", TwoProcesses)
    down = FakeServer()
    down.close()
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        "ppo",
        rollout_engine="vllm",
        vllm_mode="server",
        vllm_server_base_url=down.url,
        vllm_server_timeout=1,
        report_to=["none"],
    )
    with pytest.raises(SettingError, match="vllm_mode server: no vLLM server answers"):
        run.run_training(config)
