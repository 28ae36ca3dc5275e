"""The training config: numbers as users type them, every setting checked before any work."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cory_env.checks import SettingError
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import build_config

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize(
    ("flags", "setting", "expected"),
    [
        (["--learning_rate", "1e-5"], "learning_rate", 1e-5),
        (["--learning_rate", "1E-5"], "learning_rate", 1e-5),
        (["--learning_rate=3e-4"], "learning_rate", 3e-4),
        (["--init_kl_coef", ".5"], "init_kl_coef", 0.5),
        (["--lam", "-1"], "lam", -1.0),
        (["--lam", "-0.5"], "lam", -0.5),
        (["--lam=-1e-1"], "lam", -0.1),
        (["--lam", "-.5"], "lam", -0.5),
        (["--eta", "1e-3"], "eta", 1e-3),
        (["--iterations", "1e3"], "iterations", 1000),
    ],
)
def test_numbers_parse_as_numbers_whatever_the_spelling(flags, setting, expected):
    config, _ = parse_args(flags, "cory")
    if setting in PPO_NAMES:
        value = config.learner[setting]
    else:
        value = getattr(config.game if setting == "lam" else config, setting)
    assert value == pytest.approx(expected) and not isinstance(value, str)
    assert type(value) is type(expected)


PPO_NAMES = {"learning_rate", "init_kl_coef"}


def readme_training_commands() -> list[list[str]]:
    """The flags of every ``python train/{cory,ppo}.py`` line in the README that needs no run."""
    commands = []
    for line in README.read_text().splitlines():
        match = re.search(r"python train/(cory|ppo)\.py\s+([^`|#]*)", line)
        # (the unigram example needs its README code first: tests/test_learners.py runs it)
        if match and "runs/x" not in match.group(2) and "unigram" not in match.group(2):
            commands.append([match.group(1), *shlex.split(match.group(2))])
    return commands


def test_readme_commands_build_valid_configs():
    commands = readme_training_commands()
    assert len(commands) >= 4, commands
    for algorithm, *flags in commands:
        flags = [f for f in flags if f not in ("&&",)]
        parse_args(flags, algorithm)
    # The README's example flags, exactly as written there.
    text = README.read_text()
    example = re.search(r"`(--batch_size 64 --learning_rate 1e-5 --lam 0)`", text)
    assert example, "the README's example flags changed: update this test"
    config, _ = parse_args(example.group(1).split(), "cory")
    assert config.learner["learning_rate"] == 1e-5 and config.game.lam == 0.0
    assert config.batch_size == 64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"role_exchange_period": True}, "role_exchange_period must be an integer >= 1, got True"),
        ({"iterations": 1.5}, "iterations must be an integer >= 1, got 1.5"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"batch_size": "8"}, "batch_size must be an integer >= 1, got '8'"),
        ({"lam": float("nan")}, "lam must be a finite number"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"health_clipfrac": 2}, "health_clipfrac must be a finite number > 0 and <= 1"),
        ({"lora": "yes"}, "lora must be true or false"),
        ({"activation_checkpointing": 1}, "activation_checkpointing must be true or false"),
        ({"device": "gpu"}, "device must be one of"),
        ({"max_new_tokens": [8, 4]}, "max_new_tokens"),
        ({"task_settings": "reward=vader"}, "task_settings must be a mapping"),
        ({"learner": {"mini_batch_size": 0}}, "ppo: mini_batch_size must be an integer >= 1"),
        ({"learner": {"ppo_epochs": 2.5}}, "ppo: ppo_epochs must be an integer >= 1, got 2.5"),
        ({"learner": {"max_grad_norm": -1.0}}, "max_grad_norm must be a finite number > 0"),
        ({"learner": {"learning_rate": "1e-5x"}}, "learning_rate must be a finite number > 0"),
        ({"learner": {"learning_rate": -1e-5}}, "learning_rate must be a finite number > 0"),
        ({"learner": {"gamma": 1.5}}, "gamma must be a finite number >= 0 and <= 1"),
        ({"learner": {"adaptive_kl": 1}}, "adaptive_kl must be true or false"),
        ({"learner": {"kl_penalty": "k9"}}, "kl_penalty must be one of"),
        ({"learner": 3}, "learner must be a mapping"),
        ({"batchsize": 3}, r"unknown settings \['batchsize'\]"),
    ],
)
def test_every_setting_is_checked_when_the_config_is_built(overrides, message):
    with pytest.raises(SettingError, match=re.escape(message) if "\\" not in message else message):
        build_config("smoke", overrides=overrides)


def test_a_negative_grad_norm_is_refused_because_it_reverses_gradients():
    with pytest.raises(SettingError, match="reverse the gradients"):
        build_config(overrides={"learner": {"max_grad_norm": -0.5}})


def test_bad_flag_value_names_the_flag_and_value(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--batch_size", "[1,"], "cory")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--batch_size" in err and "[1," in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        parse_args(["--ppo_epochs", "2.5"], "cory")
    assert "ppo_epochs must be an integer >= 1, got 2.5" in capsys.readouterr().err


def test_malformed_yaml_file_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("batch_size: 8\niterations: [1, 2\nlam: 1\n")
    with pytest.raises(SettingError, match=r"bad\.yaml, line \d+: not valid YAML"):
        build_config(config_file=path)
    with pytest.raises(SystemExit):
        parse_args(["--config", str(path)], "cory")
    assert "bad.yaml, line" in capsys.readouterr().err
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(SettingError, match="not UTF-8"):
        build_config(config_file=binary)


def test_resume_of_a_folder_without_a_run_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--resume", str(tmp_path / "nothing")], "cory")
    assert "not a run folder" in capsys.readouterr().err


def test_saved_config_reloads_to_the_same_config(tmp_path):
    config, _ = parse_args(["--preset", "cpu", "--learning_rate", "1e-5", "--lam", "-1"], "cory")
    config.save(tmp_path / "c.yaml")
    assert build_config(config_file=tmp_path / "c.yaml") == config


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_hold_numbers_not_strings(preset):
    config = build_config(preset)
    assert isinstance(config.learner["learning_rate"], float)


@pytest.mark.parametrize(("algorithm", "kl", "scaled"), [("ppo", 0.3, False), ("cory", 0.4, True)])
def test_paper_imdb_is_the_official_scripts_configuration(algorithm, kl, scaled):
    config = build_config("paper-imdb", algorithm=algorithm)
    seats = [settings for _, settings in config.seat_learners().values()]
    settings = seats[0]
    assert all(other == settings for other in seats)
    assert (config.batch_size, config.iterations) == (256, 102)
    assert config.game.max_new_tokens == [4, 16]  # 4-15 new tokens
    assert settings.mini_batch_size == 256 and settings.ppo_epochs == 4
    assert settings.learning_rate == 1.41e-5 and settings.repetition_penalty == 1.1
    assert settings.adaptive_kl and (settings.kl_target, settings.kl_horizon) == (6.0, 10000)
    assert settings.init_kl_coef == kl
    assert settings.score_scaling is scaled and settings.score_norm is scaled


@pytest.mark.parametrize(("algorithm", "kl", "scaled"), [("ppo", 0.3, False), ("cory", 0.4, True)])
def test_cpu_paper_keeps_each_scripts_own_settings_at_a_cpu_batch(algorithm, kl, scaled):
    config = build_config("cpu-paper", algorithm=algorithm)
    settings = [s for _, s in config.seat_learners().values()][0]
    assert config.game.max_new_tokens == [4, 16] and settings.repetition_penalty == 1.1
    assert settings.init_kl_coef == kl
    assert settings.score_scaling is scaled and settings.score_norm is scaled
    # the official controller's step per iteration, batch / horizon, at batch 32
    assert settings.adaptive_kl and config.batch_size / settings.kl_horizon == 256 / 10000


def test_each_seat_takes_its_learner_s_settings_and_a_stray_one_is_refused():
    """A preset's PPO settings are defaults: a REINFORCE run drops those it has no use for.
    A setting given explicitly that no seat's learner has is refused, naming it."""
    config = build_config("cpu", overrides={"algorithm": "reinforce"})
    assert "baseline" in config.learner and "vf_coef" not in config.learner
    assert config.learner["learning_rate"] == PRESETS["cpu"]["learner"]["learning_rate"]
    with pytest.raises(SettingError, match=r"\['vf_coef'\] are settings of no seat's learner"):
        build_config("cpu", overrides={"algorithm": "reinforce", "learner": {"vf_coef": 0.5}})
    mixed = build_config(overrides={"learners": {"llm_0": "ppo", "llm_1": "reinforce"}})
    assert {"vf_coef", "baseline"} <= set(mixed.learner)  # each belongs to one seat


def test_validation_changes_nothing_and_numbers_take_their_declared_type():
    config = build_config(
        "smoke", overrides={"batch_size": 8.0, "lam": 1, "learner": {"learning_rate": 1}}
    )
    assert type(config.batch_size) is int and type(config.game.lam) is float
    assert type(config.learner["learning_rate"]) is float
    before = config.to_dict()
    config.validate()
    assert config.to_dict() == before
    with pytest.raises(SettingError, match=r"learner settings: give them in the 'learner'"):
        build_config(overrides={"learning_rate": 1e-5})
