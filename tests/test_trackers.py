"""Experiment trackers: a run reports its config, every metrics row and its summary to
W&B, MLflow and Trackio offline (each where installed), through accelerate's trackers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cory_env.checks import SettingError
from cory_rl.train.config.resolve import build_config
from cory_rl.train.training.run import run_training
from cory_rl.train.training.trackers import COMPLETION_COLUMNS, completion_rows
from tests.conftest import tiny_config, tiny_flags

ROOT = Path(__file__).resolve().parents[1]


def needs(package):
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed"
    )


def train_reporting_to(tracker, model_dir, run_dir, env):
    """A tiny CORY run in its own process (trackers keep process-wide state)."""
    flags = tiny_flags(model_dir, run_dir, max_new_tokens="[2, 4]", report_to=tracker)
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "train" / "cory.py"), *flags],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(run_dir).parent,  # MLflow's ./mlruns
        env={**base, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_report_to_is_checked_before_any_model_loads(monkeypatch):
    with pytest.raises(SettingError, match="report_to must be one of"):
        build_config("smoke", overrides={"report_to": "tensorboard,comet"})
    with pytest.raises(SettingError, match="'none' alone"):
        build_config("smoke", overrides={"report_to": ["none", "wandb"]})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(SettingError, match="wandb is not installed; pip install wandb"):
        build_config("smoke", overrides={"report_to": "wandb"})
    assert build_config("smoke", overrides={"report_to": "none"}).report_to == ["none"]


def test_report_to_none_writes_no_tensorboard_files(tiny_model_dir, tmp_path):
    run = run_training(
        tiny_config(tiny_model_dir, tmp_path / "run", iterations=2, report_to="none")
    )
    assert not (run.path / "tensorboard").exists() and (run.path / "metrics.jsonl").exists()


@needs("mlflow")
def test_mlflow_gets_config_metrics_and_summary(tiny_model_dir, tmp_path):
    pytest.importorskip("sqlalchemy", reason="MLflow's local database store needs sqlalchemy")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow's default kind of local store
    train_reporting_to("mlflow", tiny_model_dir, tmp_path / "run", {"MLFLOW_TRACKING_URI": store})
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    [run] = client.search_runs([client.get_experiment_by_name("cory").experiment_id])
    assert run.info.run_name == "run"
    assert float(run.data.params["learner/learning_rate"]) == 1e-5
    assert run.data.params["game/lam"] == "1.0"
    history = client.get_metric_history(run.info.run_id, "llm_0/score")
    assert [m.step for m in history] == [0, 1]
    assert run.data.metrics["summary/iterations"] == 2.0
    # the games of each sampled iteration, one row per game and role, as a table artifact
    files = [a.path for a in client.list_artifacts(run.info.run_id, "completions")]
    assert "completions/iteration_000001.json" in files
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, files[-1], str(tmp_path))).read_text()
    )
    assert table["columns"] == COMPLETION_COLUMNS
    assert {row[2] for row in table["data"]} == {"pioneer", "observer"}


@needs("wandb")
def test_wandb_without_an_api_key_logs_offline_and_says_so(tiny_model_dir, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login x password y\n")  # no W&B entry
    done = train_reporting_to("wandb", tiny_model_dir, tmp_path / "run", {"NETRC": str(netrc)})
    assert "no W&B API key" in done.stdout and "wandb sync" in done.stdout
    [log] = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    # The offline run's transaction log holds the records `wandb sync` would upload; its
    # keys are plain strings in it.
    data = log.read_bytes()
    for key in (
        b"learner/learning_rate",
        b"game/lam",
        b"llm_0/score",
        b"summary/iterations",
        b"completions",
        b"table-file",
    ):
        assert key in data, key


@needs("trackio")
def test_trackio_local_store_gets_metrics_and_summary(tiny_model_dir, tmp_path):
    env = {"TRACKIO_DIR": str(tmp_path / "trackio")}
    train_reporting_to("trackio", tiny_model_dir, tmp_path / "run", env)
    read = (
        "import json, trackio; from trackio.sqlite_storage import SQLiteStorage; "
        "print(json.dumps(SQLiteStorage.get_logs('cory', 'run')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", read],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=True,
    )
    logs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["step"] for r in logs if "llm_0/score" in r] == [0, 1]
    assert any(r.get("summary/iterations") == 2 for r in logs)
    [table] = [r["completions"] for r in logs if r["step"] == 1 and "completions" in r]
    assert "observer" in json.dumps(table) and "pioneer" in json.dumps(table)


def test_completion_rows_are_one_per_game_and_role():
    pioneer = {"agent": "llm_0", "response": "a", "score": 0.5, "reward": 0.5}
    observer = {"agent": "llm_1", "response": "b", "score": 1.0, "reward": 0.7}
    samples = [{"query": "q", "pioneer": pioneer, "observer": observer}]
    assert completion_rows(3, samples) == [
        [3, "q", "pioneer", "llm_0", "a", 0.5, 0.5],
        [3, "q", "observer", "llm_1", "b", 1.0, 0.7],
    ]


def test_wandb_goes_offline_only_without_a_key_or_a_mode(tmp_path, monkeypatch):
    from cory_rl.train.config.tracker_checks import prepare_trackers

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai login user password KEY\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert prepare_trackers(["wandb"], tmp_path) == [] and "WANDB_MODE" not in os.environ
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's explicit choice is kept
    assert prepare_trackers(["wandb"], tmp_path) == [] and os.environ["WANDB_MODE"] == "online"
    monkeypatch.delenv("WANDB_MODE")
    assert prepare_trackers(["tensorboard"], tmp_path) == []
    [note] = prepare_trackers(["wandb"], tmp_path)
    assert os.environ["WANDB_MODE"] == "offline" and "offline" in note
