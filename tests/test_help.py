"""``--help`` of the training commands: every flag has one line of help with its default,
taken from its config field's own documentation (``cory_rl.train.config.field_docs``)."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from cory_env.core import GAME_SETTINGS, GameSettings
from cory_rl.agents.registry import available_learners, learner_spec
from cory_rl.train.commands.train_flags import make_parser, parse_args
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.field_docs import field_docs, first_sentence, plain, show_default
from cory_rl.train.config.train_config import TrainConfig

COMMANDS = ("cory", "ppo")
"""The algorithms of ``train/cory.py`` and ``train/ppo.py``."""


def project_learner_configs() -> dict[str, type]:
    """The learners' settings dataclasses of this project (not those a test or a plugin
    registered), by learner name."""
    configs = {name: learner_spec(name).config for name in available_learners()}
    return {
        name: config
        for name, config in configs.items()
        if config is not None and config.__module__.startswith("cory_rl.agents.")
    }


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every shown flag of ``parser`` (not ``--help``), by its name."""
    return {
        action.option_strings[0]: action
        for action in parser._actions
        if action.option_strings
        and action.help is not argparse.SUPPRESS
        and action.option_strings[0] not in ("-h", "--help")
    }


@pytest.fixture(scope="module", params=COMMANDS)
def command(request: pytest.FixtureRequest) -> tuple[str, argparse.ArgumentParser, str]:
    """A training command's algorithm, its parser and the help it prints."""
    parser = make_parser(request.param)
    return request.param, parser, parser.format_help()


def test_the_commands_print_their_help(capsys):
    for algorithm in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            parse_args(["--help"], algorithm=algorithm)
        assert stop.value.code == 0
        printed = capsys.readouterr().out
        assert f"Train with {algorithm.upper()}" in printed
        assert "--learning_rate LEARNING_RATE" in printed
        assert f"--algorithm {algorithm}'s" in " ".join(printed.split())


def test_every_flag_has_help_with_its_default(command):
    _, parser, text = command
    shown = flags(parser)
    assert len(shown) > 90
    for name, action in shown.items():
        assert action.help, f"{name} has no help"
        sentence, _, default = action.help.rpartition("(default: ")
        assert sentence.strip(), f"{name}'s help is only its default: {action.help!r}"
        assert default.endswith(")") and len(default) > 1, f"{name}: {action.help!r}"
    printed = "".join(text.split())  # argparse wraps lines at spaces and hyphens
    for name, action in shown.items():
        assert "".join((action.help % {}).split()) in printed, name


def test_every_setting_is_documented():
    """One source: each field of the config, the game and the learners has a docstring."""
    owners = {"TrainConfig": TrainConfig, "GameSettings": GameSettings, **project_learner_configs()}
    for owner, cls in owners.items():
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{owner}: fields without documentation: {missing}"


def test_a_fields_docstring_is_its_flags_help(command):
    algorithm, parser, _ = command
    shown = flags(parser)
    for name in [f.name for f in dataclasses.fields(TrainConfig)]:
        flag = {"imports": "--import"}.get(name, f"--{name}")  # one module a flag
        assert shown[flag].help.startswith(first_sentence(field_docs(TrainConfig)[name]))
    for name in GAME_SETTINGS:
        assert shown[f"--{name}"].help.startswith(first_sentence(field_docs(GameSettings)[name]))
    seat = ALGORITHMS[algorithm].seat_learner
    own = project_learner_configs()[seat]
    for name, doc in field_docs(own).items():
        assert shown[f"--{name}"].help.startswith(first_sentence(doc)), name
    for config in project_learner_configs().values():
        for f in dataclasses.fields(config):
            candidates = {
                first_sentence(field_docs(c).get(f.name, ""))
                for c in project_learner_configs().values()
            }
            assert any(shown[f"--{f.name}"].help.startswith(c) for c in candidates if c)
    # the docstring's words, as written under the field
    assert shown["--batch_size"].help.startswith("Games played per iteration, in each process")
    assert shown["--vf_coef"].help.startswith("Weight of the value loss")


def test_the_default_shown_is_the_commands_own(command):
    algorithm, parser, _ = command
    shown = flags(parser)
    algo = ALGORITHMS[algorithm]
    init_kl = algo.learner["init_kl_coef"]  # 0.4 for cory, 0.3 for ppo
    assert shown["--init_kl_coef"].help.endswith(f"(default: {init_kl})")
    assert shown["--n_agents"].help.endswith(f"(default: {algo.n_agents})")
    assert shown["--algorithm"].help.endswith(f"(default: {algorithm})")
    assert shown["--batch_size"].help.endswith("(default: 32)")
    assert shown["--report_to"].help.endswith("(default: [tensorboard])")
    assert shown["--kl_target"].help.endswith("(default: 6.0)")


def test_field_docs_read_attribute_docstrings_and_docstring_lists():
    @dataclasses.dataclass
    class Base:
        """Settings.

        - ``listed``: documented in the class's list, over
          two lines.
        - ``a``, ``b``: one item for two fields.
        """

        listed: int = 1
        a: int = 2
        b: int = 3
        own: str = "x"
        """Its own docstring (e.g. this one). A second sentence."""
        bare: int = 0

    @dataclasses.dataclass
    class Child(Base):
        own: str = "y"
        """The child's word wins."""
        extra: float = 0.5
        """Percent: 50% of it."""

    docs = field_docs(Base)
    assert docs["listed"] == "documented in the class's list, over two lines."
    assert docs["a"] == docs["b"] == "one item for two fields."
    assert first_sentence(docs["own"]) == "Its own docstring (e.g. this one)."
    assert "bare" not in docs
    assert field_docs(Child)["own"] == "The child's word wins."
    assert field_docs(Child)["listed"] == docs["listed"]
    assert field_docs(Child)["extra"] == "Percent: 50% of it."


def test_first_sentence_and_defaults_as_written():
    text = "The ``clip`` of :class:`cory_rl.agents.ppo.PPOConfig` (TRL 0.7's, i.e. 0.2). More."
    assert plain(text) == "The clip of PPOConfig (TRL 0.7's, i.e. 0.2). More."
    assert first_sentence(text) == "The clip of PPOConfig (TRL 0.7's, i.e. 0.2)."
    assert first_sentence("Decay 0.995 of Ziegler et al. 2019 here. Then") == (
        "Decay 0.995 of Ziegler et al. 2019 here."
    )
    assert re.fullmatch(r"no end", first_sentence("no end"))
    assert show_default(None) == "None"
    assert show_default(["tensorboard"]) == "[tensorboard]"
    assert show_default({"a": 1, "b": [2]}) == "{a: 1, b: [2]}"
    assert show_default("") == "''"


def test_a_percent_in_a_docstring_does_not_break_the_help(monkeypatch):
    from cory_rl.train.config import field_docs as module

    real = module.field_docs

    def with_percent(cls: type) -> dict[str, str]:
        docs = dict(real(cls))
        if cls is TrainConfig:
            docs["seed"] = "Seed, 100% reproducible."
        return docs

    monkeypatch.setattr(module, "field_docs", with_percent)  # what field_help reads
    parser = make_parser("ppo")
    assert "Seed, 100% reproducible. (default: 0)" in " ".join(parser.format_help().split())
