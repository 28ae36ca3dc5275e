"""The training scripts' path (config, loop, run folder, resume) on a tiny model."""

from __future__ import annotations

import pytest
import yaml

from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import build_config
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config, tiny_flags


@pytest.mark.parametrize("algorithm", ["cory", "ppo"])
def test_run_writes_the_run_folder(tiny_model_dir, tmp_path, algorithm):
    config = tiny_config(tiny_model_dir, tmp_path / "run", algorithm)
    run = run_training(config)
    files = {p.name for p in run.path.iterdir()}
    assert {
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "curves.png",
        "checkpoint",
        "tensorboard",
    } <= files
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    agents = ["llm_0", "llm_1"] if algorithm == "cory" else ["llm_0"]
    for agent in agents:
        for key in ("score", "kl", "objective", "role", "objective/kl_coef", "ppo/loss_value"):
            assert f"{agent}/{key}" in rows[0]
    if algorithm == "cory":  # period 1: roles swap every iteration
        assert [r["llm_0/role"] for r in rows] == ["pioneer", "observer", "pioneer"]
        assert "observer/score" in rows[0] and "pioneer/kl" in rows[0]
    # Role exchanges keep each agent's state: the adaptive KL coefficient keeps moving
    # from where it was instead of restarting at init_kl_coef.
    coefs = [r["llm_0/objective/kl_coef"] for r in rows]
    assert (
        coefs[0] == config.learner["init_kl_coef"] and coefs[1] != coefs[0] and coefs[2] != coefs[1]
    )
    sample = read_jsonl(run.path / "samples.jsonl")[0]
    assert "query" in sample and "response" in sample["pioneer"]
    held = {p.name for p in (run.path / "checkpoint" / "llm_0").iterdir()}
    assert held == {"agent.json", "policy.safetensors", "state.safetensors"}
    saved = yaml.safe_load((run.path / "config.yaml").read_text())
    assert saved["algorithm"] == algorithm and saved["learner"]["ppo_epochs"] == 2


def test_resume_continues_exactly_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """3 iterations + resume to 5 give the same metrics as 5 iterations straight."""
    straight = run_training(
        tiny_config(tiny_model_dir, tmp_path / "a", iterations=5, checkpoint_every=3)
    )
    first = run_training(
        tiny_config(tiny_model_dir, tmp_path / "b", iterations=3, checkpoint_every=3)
    )
    config, resume = parse_args(["--resume", str(first.path), "--iterations", "5"], "cory")
    resumed = run_training(config, resume)
    assert yaml.safe_load((resumed.path / "config.yaml").read_text())["iterations"] == 5
    a = read_jsonl(straight.path / "metrics.jsonl")
    b = read_jsonl(resumed.path / "metrics.jsonl")
    assert [r["iteration"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        for key in ("llm_0/score", "llm_1/score", "llm_0/kl", "llm_1/ppo/loss_policy"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["iteration"], key)


def test_existing_run_folder_is_not_overwritten(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path / "run", iterations=2)
    run_training(config)
    with pytest.raises(FileExistsError, match="--resume"):
        run_training(config)


def test_config_precedence_and_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"batch_size": 64, "learner": {"learning_rate": 0.5}}))
    config, _ = parse_args(
        [
            "--preset",
            "cpu",
            "--config",
            str(path),
            "--iterations",
            "7",
            "--ppo_epochs",
            "3",
            "--max_new_tokens",
            "[3, 6]",
        ],
        "ppo",
    )
    assert config.algorithm == "ppo" and config.game.n_agents == 1
    assert config.batch_size == 64 and config.iterations == 7
    assert config.learner["learning_rate"] == 0.5 and config.learner["ppo_epochs"] == 3
    assert config.learner["mini_batch_size"] == PRESETS["cpu"]["learner"]["mini_batch_size"]
    assert config.game.max_new_tokens == [3, 6]
    config.save(tmp_path / "saved.yaml")
    again = build_config(config_file=tmp_path / "saved.yaml", algorithm="ppo")
    assert again == config
    with pytest.raises(ValueError, match="unknown preset"):
        build_config("fast")
    with pytest.raises(ValueError, match="multiple of mini_batch_size"):
        build_config(overrides={"batch_size": 10, "learner": {"mini_batch_size": 4}})


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("algorithm", ["cory", "ppo"])
def test_every_preset_is_a_valid_config(preset, algorithm):
    config = build_config(preset, algorithm=algorithm)
    assert config.game.n_agents == (2 if algorithm == "cory" else 1)
    assert config.batch_size % config.learner["mini_batch_size"] == 0


def test_readme_style_flags_train_end_to_end(tiny_model_dir, tmp_path, capsys):
    """``--learning_rate 1e-5`` once crashed inside torch's Adam (YAML 1.1 read a string)."""
    from cory_rl.train.commands.train import main

    flags = tiny_flags(tiny_model_dir, tmp_path / "r", learning_rate="1e-5", lam=-0.5)
    run = main("ppo", flags)
    saved = yaml.safe_load((run.path / "config.yaml").read_text())
    assert saved["learner"]["learning_rate"] == 1e-5 and saved["game"]["lam"] == -0.5
    out = capsys.readouterr().out
    assert "run summary (2 iterations" in out and "s/iteration" in out and "on disk" in out


def test_callbacks_see_every_phase_in_order_and_every_row(tiny_model_dir, tmp_path):
    import contextlib

    from cory_rl.train.analysis.run_plots import plot_run
    from cory_rl.train.core.build import build_game_and_learners
    from cory_rl.train.core.callbacks import Callback
    from cory_rl.train.evaluation.along import TrainingEvaluations
    from cory_rl.train.training.loop import train

    class Record(Callback):
        def __init__(self):
            self.events, self.rows = [], []

        @contextlib.contextmanager
        def phase(self, name, iteration):
            self.events.append(("enter", name, iteration))
            yield
            self.events.append(("exit", name, iteration))

        def on_row(self, row):
            self.rows.append(row)

    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        iterations=2,
        checkpoint_every=1,
        eval_every=2,
        eval_queries=2,
        eval_samples=1,
    )
    game, learners = build_game_and_learners(config)
    record = Record()
    train(
        config,
        learners,
        game,
        tmp_path / "run",
        callbacks=[record],
        plots=plot_run,
        evaluations=lambda path: TrainingEvaluations(config, game.tokenizers, path),
    )
    entered = [(name, it) for kind, name, it in record.events if kind == "enter"]
    one = ["rollout", "checkpoint", "learn", "logging"]
    assert entered == [
        ("evaluation", 0),
        *((name, 0) for name in [*one, "checkpoint"]),
        *((name, 1) for name in [*one, "evaluation", "checkpoint"]),
        ("final checkpoint write", 2),
        ("plots", 2),
    ]
    assert all(("exit", n, i) in record.events for _, n, i in record.events)
    assert [r.get("eval/updates") for r in record.rows] == [0, None, None, 2]


@pytest.mark.parametrize("restart", [False, True])
def test_restart_on_exchange_gives_fresh_optimisers_at_each_exchange(
    tiny_model_dir, tmp_path, monkeypatch, restart
):
    """The official code's save-and-reload at a role exchange, on request: every agent's
    Adam state, KL coefficient and score statistics start again at iterations 2 and 4 of a
    period-2 game; the weights are kept. Off (the default), nothing restarts."""
    from cory_rl.agents.llm import LLMLearner

    seen: list[tuple[int, float, int]] = []
    original = LLMLearner.restart

    def recording(self):
        before = len(self.optimizer.state)
        original(self)
        seen.append((before, self.shaping.kl_ctl.value, len(self.optimizer.state)))

    monkeypatch.setattr(LLMLearner, "restart", recording)
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        iterations=5,
        role_exchange_period=2,
        restart_on_exchange=restart,
        learner={"adaptive_kl": True},
    )
    run_training(config)
    if not restart:
        assert seen == []
        return
    assert len(seen) == 4  # two agents, at iterations 2 and 4
    init = config.learner.get("init_kl_coef", PRESETS["smoke"]["learner"]["init_kl_coef"])
    for before, kl_coef, after in seen:
        assert before > 0 and after == 0 and kl_coef == pytest.approx(init)
