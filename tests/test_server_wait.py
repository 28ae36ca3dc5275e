"""The wait for a vLLM server (``vllm_mode: server``): it says where it waits and for how
long, and a port where nothing listens is refused after seconds of refusals, before any
model loads, not after the whole ``vllm_server_timeout``."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cory_env.checks import SettingError
from cory_rl.train.commands import train as run
from cory_rl.train.core import server_wait
from tests.conftest import tiny_flags


def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_that_stays_refused_fails_long_before_the_timeout(monkeypatch):
    monkeypatch.setattr(server_wait, "REFUSED_LIMIT_S", 2.0)
    port, notes = closed_port(), []
    start = time.monotonic()
    with pytest.raises(SettingError) as err:
        server_wait.wait_for_listener(
            f"http://127.0.0.1:{port}", 240, say=notes.append, find_server_process=lambda port: None
        )
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert f"nothing listens at 127.0.0.1:{port}" in message and "\n" not in message
    assert "every connection refused for 2 s" in message and "vllm serve" in message
    assert notes and f"waiting for the vLLM server at http://127.0.0.1:{port}" in notes[0]
    assert "0 s of at most 240 s (vllm_server_timeout), or 2 s of refusals in a row" in notes[0]


def test_a_vllm_process_on_this_machine_is_waited_for_and_said(monkeypatch):
    monkeypatch.setattr(server_wait, "REFUSED_LIMIT_S", 0.5)
    port, notes = closed_port(), []
    with pytest.raises(SettingError, match=r"within 2 s \(vllm_server_timeout; nothing listens"):
        server_wait.wait_for_listener(
            f"http://localhost:{port}/", 2, say=notes.append, find_server_process=lambda port: 4242
        )
    assert "a vLLM server of this port (pid 4242) runs here, maybe starting" in notes[0]


def test_the_wait_ends_when_something_listens():
    port = closed_port()
    listener = socket.socket()

    def open_later() -> None:
        time.sleep(1.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    threading.Thread(target=open_later, daemon=True).start()
    try:
        server_wait.wait_for_listener(
            f"http://127.0.0.1:{port}", 30, say=None, find_server_process=lambda port: None
        )
    finally:
        listener.close()


def test_a_server_address_without_a_host_is_one_line():
    with pytest.raises(SettingError, match="names no host"):
        server_wait.host_port("http://:8000")


def test_a_run_refuses_a_port_where_nothing_listens_before_any_model_loads(
    tiny_model_dir, tmp_path, no_model_load, monkeypatch, capsys
):
    monkeypatch.setattr(server_wait, "REFUSED_LIMIT_S", 1.0)
    monkeypatch.setattr(server_wait, "local_vllm_process", lambda port: None)
    port = closed_port()
    flags = tiny_flags(tiny_model_dir, tmp_path / "run")
    flags += ["--rollout_engine", "vllm", "--vllm_mode", "server", "--vllm_server_port", str(port)]
    with pytest.raises(SystemExit) as exit_:
        run.main("ppo", flags)
    message = str(exit_.value)
    assert message.startswith("error: vllm_mode server: no vLLM server answers") and (
        f"nothing listens at 127.0.0.1:{port}" in message
    )
    assert f"waiting for the vLLM server at http://127.0.0.1:{port}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "port"),
    [
        ("vllm serve /models/m --port 8011", 8011),
        ("/venv/bin/vllm serve /models/m", 8000),
        ("python -m vllm.entrypoints.openai.api_server --model m --port=9000", 9000),
        ("python -m pytest tests/test_engine_server.py -k vllm", None),
        ("grep -rn vllm_server_timeout", None),
    ],
)
def test_only_a_vllm_server_s_command_line_counts_with_its_port(command, port):
    assert server_wait.served_port(command.split()) == port
