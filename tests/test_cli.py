"""The console commands exit 0 on success: a console script passes its function's return
value to sys.exit, and anything but None or an int would print it and exit 1."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PYPROJECT = (Path(__file__).parents[1] / "pyproject.toml").read_text()
SECTION = PYPROJECT.split("[project.scripts]")[1].split("\n[")[0]
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', SECTION, flags=re.M))
MAINS = {
    "cory-train": "cory_rl.train.commands.train",
    "cory-eval": "cory_rl.train.commands.evaluate",
    "cory-export": "cory_rl.train.commands.export",
    "cory-sweep": "cory_rl.train.commands.sweep",
    "cory-compare": "cory_rl.train.commands.compare",
    "cory-play": "cory_rl.train.commands.play",
    "cory-plots": "cory_rl.train.commands.plots",
    "cory-health": "cory_rl.train.commands.health",
    "cory-tune": "cory_rl.train.commands.tuning",
    "cory-frontier": "cory_rl.train.commands.frontier",
    "cory-eval-saved": "cory_rl.train.commands.eval_saved",
}


def test_every_console_command_is_covered():
    assert set(SCRIPTS) == set(MAINS)


@pytest.mark.parametrize("command", sorted(MAINS))
def test_a_command_runs_its_scripts_main_and_returns_none(command, monkeypatch):
    calls = []

    def main(*args):
        calls.append(args)
        return ["what the script made"]

    from cory_rl.train.config import allocator

    # cory-train settles the allocator first: here that would re-execute pytest itself
    monkeypatch.setattr(allocator, "relaunch_for", lambda flags: calls.append("allocator"))
    monkeypatch.setattr(importlib.import_module(MAINS[command]), "main", main)
    module, function = SCRIPTS[command].split(":")
    assert getattr(importlib.import_module(module), function)() is None
    if command == "cory-train":
        assert calls == ["allocator", ("cory",)]
    else:
        assert calls == [()]


@pytest.mark.parametrize("command", sorted(set(MAINS) - {"cory-train"}))
def test_help_says_the_whole_first_sentence(command, capsys):
    """A docstring's first sentence may wrap in the source; --help prints all of it, not the
    first line cut at "... as the setting varies, at"."""
    module = importlib.import_module(MAINS[command])
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    first_paragraph = " ".join(module.__doc__.split("\n\n")[0].split())
    assert first_paragraph in printed
    assert first_paragraph.rstrip("`").endswith((".", ")"))
