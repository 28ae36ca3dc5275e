"""Mistakes in the user's own data, reward code and services: one line that names the file,
function or address and what to do; found before any model loads wherever they can be; a
run stopped by one keeps its last checkpoint, and resumes once the mistake is mended."""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cory_env import custom_task
from cory_env.checks import RewardOutputError
from cory_env.tasks.base import REWARD_LIMIT
from cory_rl.train.commands import train as run
from tests.conftest import read_jsonl, tiny_flags, user_module

REWARDS = """
NOT_A_FUNCTION = 3
FAIL_AT_CALL = None
calls = 0


def score(queries, responses, answers=None):
    global calls
    calls += 1
    if FAIL_AT_CALL is not None and calls >= FAIL_AT_CALL:
        raise KeyError("the judge's table has no row 'x'")
    return [float(len(r)) for r in responses]


def few(queries, responses, answers=None):
    return [1.0]


def nan(queries, responses, answers=None):
    return [float("nan")] * len(responses)


def strings(queries, responses, answers=None):
    return ["good"] * len(responses)


def raises(queries, responses, answers=None):
    return {"x": 1}["y"]


def huge(queries, responses, answers=None):
    return [1e30] * len(responses)
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The user's working folder: a reward module and data files of every kind of mistake."""
    name = user_module(tmp_path, monkeypatch, "rw", REWARDS)
    rows = [{"prompt": f"question {i}", "n": i} for i in range(10)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "one.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (tmp_path / "data.txt").write_text("a\nb\n")
    (tmp_path / "empty.csv").write_text("")
    yield tmp_path, name
    sys.modules.pop(name, None)


def train(folder, model, settings, *extra):
    flags = [
        *tiny_flags(model, folder / "run", max_new_tokens=3, task="custom", task_settings=settings),
        *extra,
    ]
    return run.main("cory", flags)


def one_line(exit_: pytest.ExceptionInfo) -> str:
    message = str(exit_.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


BEFORE_ANY_MODEL = [
    (
        "{dataset: data.jsonl, prompt_column: text, reward: 'M:score'}",
        "'data.jsonl' has no column 'text'; its columns are ['prompt', 'n']",
    ),
    ("{dataset: empty.jsonl, reward: 'M:score'}", "'empty.jsonl' is empty"),
    ("{dataset: empty.csv, reward: 'M:score'}", "'empty.csv' is empty"),
    ("{dataset: broken.jsonl, reward: 'M:score'}", "'broken.jsonl', line 2: not valid JSON"),
    (
        "{dataset: data.jsonl, prompt_column: n, reward: 'M:score'}",
        "row 0: 'n' must be non-empty text, got int",
    ),
    ("{dataset: data.txt, reward: 'M:score'}", "must be a local .jsonl/.json/.csv/.parquet"),
    ("{dataset: missing.jsonl, reward: 'M:score'}", "'missing.jsonl' does not exist"),
    ("{dataset: one.jsonl, reward: 'M:score'}", "has 1 row(s); every 5th row is held out"),
    ("{dataset: data.jsonl, reward: 'nowhere:score'}", "no module named 'nowhere'"),
    ("{dataset: data.jsonl, reward: 'M:nothing'}", "has no 'nothing'; its functions are"),
    ("{dataset: data.jsonl, reward: 'M:NOT_A_FUNCTION'}", "is a int, not a function"),
    (
        "{dataset: data.jsonl, reward: 'ftp://host/path'}",
        "reached over http:// or https://, not ftp://",
    ),
]


@pytest.mark.parametrize(("settings", "message"), BEFORE_ANY_MODEL)
def test_a_mistake_in_the_data_or_the_reward_s_name_is_one_line_before_any_model_loads(
    folder, tiny_model_dir, no_model_load, settings, message
):
    path, module = folder
    with pytest.raises(SystemExit) as exit_:
        train(path, tiny_model_dir, settings.replace("M:", f"{module}.py:"))
    assert message in one_line(exit_)
    assert not (path / "run" / "config.yaml").exists()


class Server(BaseHTTPRequestHandler):
    answer = b"[1.0]"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()


def test_a_reward_server_is_probed_before_any_model_loads(
    folder, tiny_model_dir, no_model_load, server
):
    path, _ = folder
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/x"
    with pytest.raises(SystemExit) as exit_:
        train(path, tiny_model_dir, f"{{dataset: data.jsonl, reward: '{down}'}}")
    assert f"reward server {down} cannot be reached" in one_line(exit_)
    httpd, url = server
    for answer, message in [
        (b"<html>oops</html>", "something that is not JSON"),
        (b'{"score": 1}', "it must answer a JSON list of scores"),
        (b'["a"]', "whose row 0 is str 'a'"),
    ]:
        httpd.RequestHandlerClass.answer = answer
        with pytest.raises(SystemExit) as exit_:
            train(path, tiny_model_dir, f"{{dataset: data.jsonl, reward: '{url}'}}")
        assert message in one_line(exit_)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("few", "returned 1 scores for 3 responses"),
        ("nan", "returned nan for row 0 (response '')"),
        ("strings", "whose row 0 is str 'good'"),
        ("raises", "raised KeyError: 'y'"),
        ("huge", "returned 1e+30 for row 0 (response ''); scores beyond +-1e+06"),
    ],
)
def test_a_reward_that_returns_the_wrong_thing_is_one_line_before_any_model_loads(
    folder, tiny_model_dir, no_model_load, function, message
):
    path, module = folder
    with pytest.raises(SystemExit) as exit_:
        train(path, tiny_model_dir, f"{{dataset: data.jsonl, reward: '{module}.py:{function}'}}")
    text = one_line(exit_)
    assert message in text and f"reward function {module}.py:{function}" in text
    assert "a trial before any model loads" in text and "placeholder answers" in text
    assert not (path / "run" / "config.yaml").exists()


def test_the_reward_limit_is_checked_at_its_bound():
    task = custom_task(["a", "b"], lambda queries, responses: [REWARD_LIMIT, -REWARD_LIMIT])
    assert task.score(task.queries, ["x", "y"]) == [REWARD_LIMIT, -REWARD_LIMIT]
    over = custom_task(["a"], lambda queries, responses: [-REWARD_LIMIT * 1.001])
    with pytest.raises(RewardOutputError, match=r"returned -1\.001e\+06 for row 0.*rescale"):
        over.score(over.queries, ["x"])


def test_a_reward_that_raises_mid_run_leaves_a_checkpoint_that_resumes(
    folder, tiny_model_dir, monkeypatch
):
    path, _ = folder
    # the trial before the models load is call 1; the third batch's is call 4
    source = REWARDS.replace("FAIL_AT_CALL = None", "FAIL_AT_CALL = 4")
    module = user_module(path, monkeypatch, "failing", source)
    with pytest.raises(SystemExit) as exit_:
        train(
            path,
            tiny_model_dir,
            f"{{dataset: data.jsonl, reward: '{module}.py:score'}}",
            "--iterations",
            "4",
            "--checkpoint_every",
            "1",
        )
    text = one_line(exit_)
    assert f"reward function {module}.py:score raised KeyError" in text
    saved = json.loads((path / "run" / "checkpoint" / "state.json").read_text())
    assert saved["iteration"] == 1  # both finished iterations are on disk
    sys.modules[module].FAIL_AT_CALL = None  # the user mends their function, then resumes
    run.main("cory", ["--resume", str(path / "run")])
    assert [r["iteration"] for r in read_jsonl(path / "run" / "metrics.jsonl")] == [0, 1, 2, 3]
    sys.modules.pop(module, None)
