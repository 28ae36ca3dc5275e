"""``--task custom``: a user's data file (JSONL, CSV, Parquet) and a reward named by text,
their own ``module:function`` or a reward server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import cory_env
from cory_env.checks import RewardError, SettingError
from cory_env.query import Query
from cory_env.tasks.custom import template_prompt
from tests.conftest import tiny_flags, user_module

PROMPTS = [f"question {i}" for i in range(10)]
REWARD_MODULE = '''
def score(queries, responses, answers=None):
    """1 for an answer that repeats the query's last word, else 0 (and the answer's length)."""
    seen.append((list(queries), list(responses), answers))
    return [float(q.split()[-1] in r) for q, r in zip(queries, responses)]

seen = []
'''


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A working folder with the user's reward module and data files, as they would run."""
    name = user_module(tmp_path, monkeypatch, "my_rewards", REWARD_MODULE)
    rows = [{"prompt": p, "gold": str(i)} for i, p in enumerate(PROMPTS)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "data.csv").write_text(
        "prompt,gold\n" + "".join(f"{p},{i}\n" for i, p in enumerate(PROMPTS))
    )
    import pandas as pd

    pd.DataFrame(rows).to_parquet(tmp_path / "data.parquet")
    yield tmp_path, name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_a_data_file_and_a_function_of_ones_own(user_folder, suffix):
    folder, module = user_folder
    reward = f"{module}.py:score"
    settings = {"dataset": f"data.{suffix}", "reward": reward, "answer_column": "gold"}
    task = cory_env.make_task("custom", **settings)
    # every 5th row is held out: training has 8 of the 10, the test split the other 2
    assert [q.text for q in task.queries] == [p for i, p in enumerate(PROMPTS) if (i + 1) % 5]
    test = cory_env.make_task("custom", **settings, split="test")
    assert [q.text for q in test.queries] == ["question 4", "question 9"]
    scores = task.score(task.queries[:2], ["a 0 b", "nothing"])
    assert scores == [1.0, 0.0]
    seen = sys.modules[module].seen[-1]
    assert seen == (["question 0", "question 1"], ["a 0 b", "nothing"], ["0", "1"])


def test_bad_settings_are_refused_in_one_line(user_folder):
    folder, module = user_folder
    make = cory_env.make_task
    with pytest.raises(ValueError, match=r"no column 'text'; its columns are \['prompt', 'gold'\]"):
        make("custom", dataset="data.jsonl", prompt_column="text", reward=f"{module}.py:score")
    with pytest.raises(ValueError, match="no module named 'nowhere'"):
        make("custom", dataset="data.jsonl", reward="nowhere:score")
    with pytest.raises(ValueError, match=r"has no 'scores'; its functions are \['score'\]"):
        make("custom", dataset="data.jsonl", reward=f"{module}.py:scores")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        make("custom", dataset="missing.jsonl", reward=f"{module}.py:score")
    with pytest.raises(ValueError, match="jsonl/.json/.csv/.parquet"):
        make("custom", dataset="data.xlsx", reward=f"{module}.py:score")
    with pytest.raises(SettingError, match="needs a reward"):
        make("custom", dataset="data.jsonl")
    with pytest.raises(SettingError, match="needs a dataset"):
        make("custom", reward="vader")
    with pytest.raises(SettingError, match=r"unknown field\(s\) \['sentence'\]"):
        make("custom", dataset="data.jsonl", reward="vader", observer_template="Fix {sentence}")


def test_the_observer_template():
    query = Query("The film")
    assert template_prompt("Improve {answer}: {query}", 0, query, []) == "The film"
    assert template_prompt("Improve {answer}: {query}", 1, query, [" was bad"]) == (
        "Improve  was bad: The film"
    )
    assert template_prompt("{answers} -> {query}", 2, query, ["a", "b"]) == '"a", "b" -> The film'
    assert template_prompt(None, 1, query, ["a"]) == "The film"


# ---------------------------------------------------------------- a reward server


class Scores(BaseHTTPRequestHandler):
    """Scores each response by its length; ``server.mode`` makes it wrong or slow."""

    def do_POST(self):  # noqa: N802 (the http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        scores = [float(len(r)) for r in body["responses"]]
        if self.server.mode == "slow":
            time.sleep(2.0)
        if self.server.mode == "short":
            scores = scores[:1]
        out = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scores)
    httpd.mode, httpd.requests = "ok", []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()


def test_a_reward_server(user_folder, server):
    httpd, url = server
    task = cory_env.make_task("custom", dataset="data.jsonl", reward=url, reward_timeout=0.5)
    assert task.score(task.queries[:2], ["ab", "abcd"]) == [2.0, 4.0]
    assert httpd.requests[-1] == {
        "queries": ["question 0", "question 1"],
        "responses": ["ab", "abcd"],
    }
    httpd.mode = "short"
    with pytest.raises(ValueError, match="returned 1 scores for 2 responses"):
        task.score(task.queries[:2], ["ab", "abcd"])
    httpd.mode = "slow"
    with pytest.raises(Exception, match=r"did not answer within 0\.5 s"):
        task.score(task.queries[:2], ["ab", "abcd"])


def test_a_reward_server_that_is_down_is_found_when_the_task_is_made(user_folder):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RewardError, match="cannot be reached .*start it, or check the host"):
        cory_env.make_task("custom", dataset="data.jsonl", reward=f"http://127.0.0.1:{port}/x")


def test_trains_from_the_command_line(user_folder, tiny_model_dir):
    from cory_rl.train.commands.train_flags import parse_args
    from cory_rl.train.training.run import run_training
    from tests.conftest import read_jsonl

    folder, module = user_folder
    settings = (
        f"{{dataset: data.csv, reward: '{module}.py:score', observer_template: 'Again: {{query}}'}}"
    )
    flags = tiny_flags(
        tiny_model_dir,
        folder / "run",
        iterations=1,
        max_new_tokens=3,
        task="custom",
        task_settings=settings,
    )
    config, _ = parse_args(flags, "cory")
    run = run_training(config)
    [row] = read_jsonl(run.path / "metrics.jsonl")
    assert row["pioneer/score"] in (0.0, 0.25, 0.5, 0.75, 1.0)  # a mean of 0/1 over 4 games
    saved, _ = parse_args(["--config", str(run.path / "config.yaml")], "cory")
    assert saved.task_settings["observer_template"] == "Again: {query}"  # reloads as it ran
    sample = read_jsonl(run.path / "samples.jsonl")[0]
    assert sample["query"] in PROMPTS
    queries, responses, _ = sys.modules[module].seen[-1]
    assert set(queries) <= set(PROMPTS) and len(responses) == len(queries)
