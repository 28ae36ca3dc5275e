"""The turn-level game over OpenEnv (cory_env.openenv_server, cory_env.openenv_client): a
real server on a free 127.0.0.1 port in its own process, whole games through the client, and
bad requests answered with a clear error while the server goes on serving."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the openenv package is not installed (pip install openenv)")

import httpx  # noqa: E402  (openenv brings it)
from websockets.sync.client import connect  # noqa: E402

from cory_env import batched_game  # noqa: E402
from cory_env.openenv_client import CoryTurnClient  # noqa: E402
from cory_env.openenv_server import TurnAction  # noqa: E402
from cory_env.partners import fixed_partner, model_partner  # noqa: E402
from cory_env.seat_game import SeatGame  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"max_new_tokens": 6, "role_exchange_period": 1, "rounds": 2, "pay_every_round": True}
"""Two rounds, each paid: a game is two answers of the seat, each step paid its round."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """The server of the arith task (embedded tokenizer), partners: a fixed answer and a
    tiny model; stopped at the end."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "cory_env.openenv_server",
        "--task=arith",
        f"--port={port}",
        "--partner=fixed=fixed:The answer is 5.",
        f"--partner=tiny={tiny_model_dir}",
        *(f"--setting={k}={v}" for k, v in SETTINGS.items()),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.stdout.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the server did not start in 180 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def local_seat(seat, partners, tiny_model_dir):
    """The same seat in this process: the same rules, the same partners."""
    named = {"fixed": fixed_partner("The answer is 5."), "tiny": model_partner(tiny_model_dir)}
    game = batched_game("arith", batch_size=1, tokenizer="embedded", **SETTINGS)
    return SeatGame(game, seat, {a: named[p] for a, p in partners.items()})


@pytest.mark.parametrize("seat", ["llm_0", "llm_1"])
def test_whole_games_through_the_client_match_the_local_game(server, seat, tiny_model_dir):
    other = "llm_1" if seat == "llm_0" else "llm_0"
    answers = [["The answer is 5.", "5"], ["I think 12", "The answer is 12."], ["", "no"]]
    with CoryTurnClient(base_url=server).sync() as env:
        for episode, partner in [(0, "fixed"), (1, "tiny"), (2, "fixed")]:
            result = env.reset(seat=seat, partners={other: partner}, seed=3, episode=episode)
            local = local_seat(seat, {other: partner}, tiny_model_dir)
            expected = local.reset(seed=3, options={"episode": episode})
            assert result.observation.roles == expected.info["roles"]
            for answer in answers[episode]:  # the seat's answer in each round
                assert not result.done
                assert result.observation.prompt == expected.prompt
                result = env.step(TurnAction(answer=answer, seat=seat))
                expected = local.step(answer)
                assert result.done == expected.done
                assert result.reward == pytest.approx(expected.reward)  # this round's pay
                assert result.observation.responses == expected.info["responses"]
                assert result.observation.scores == expected.info["scores"]
                assert result.observation.rewards == expected.info["rewards"]
            assert result.done
        state = env.state()
        assert state.seat == seat and state.done and state.turns_played == 4


def test_bad_requests_get_clear_errors_and_the_server_serves_on(server):
    with CoryTurnClient(base_url=server).sync() as env:
        with pytest.raises(RuntimeError, match="send reset first"):
            env.step("too early")
        with pytest.raises(RuntimeError, match="unknown seat 'llm_7'"):
            env.reset(seat="llm_7")
        with pytest.raises(RuntimeError, match="unknown partners \\['nobody'\\]"):
            env.reset(seat="llm_0", partners={"llm_1": "nobody"})
        with pytest.raises(RuntimeError, match="unknown reset fields \\['colour'\\]"):
            env.reset(colour="red")
        env.reset(seat="llm_0", seed=0)
        with pytest.raises(RuntimeError, match="this session plays 'llm_0'"):
            env.step(TurnAction(answer="out of turn", seat="llm_1"))
        assert not env.step("The answer is 5.").done
        assert env.step("The answer is 5.").done
        with pytest.raises(RuntimeError, match="the game is over"):
            env.step("one more")
        assert not env.reset(seat="llm_1", seed=0).done  # the session still plays
    ws_url = server.replace("http://", "ws://") + "/ws"
    with connect(ws_url) as ws:
        for raw, message in [
            ("{not json", "Invalid JSON"),
            (json.dumps({"type": "dance"}), "Unknown message type"),
            (json.dumps({"type": "step", "data": {"text": "no answer field"}}), "answer"),
        ]:
            ws.send(raw)
            reply = json.loads(ws.recv(timeout=60))
            assert reply["type"] == "error" and message in json.dumps(reply["data"]), reply
        ws.send(json.dumps({"type": "reset", "data": {"seat": "llm_1", "seed": 1}}))
        reply = json.loads(ws.recv(timeout=60))
        assert reply["type"] == "observation" and reply["data"]["observation"]["prompt"]
    assert httpx.post(f"{server}/step", json={"nothing": 1}).status_code == 422
    assert httpx.get(f"{server}/health").status_code == 200
