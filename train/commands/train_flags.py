"""The training scripts' command line: one flag per setting, values read as YAML."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from cory_env import checks
from cory_env.core import GAME_SETTINGS
from cory_rl.train.commands.parser import ArgumentParser
from cory_rl.train.config.algorithms import ALGORITHMS
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import (
    all_learner_settings,
    build_config,
    load_config_file,
    parse_yaml,
)
from cory_rl.train.config.train_config import TrainConfig


def flag_value(text: str) -> Any:
    try:
        return parse_yaml(text)
    except checks.SettingError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is {str(err).lstrip(': ')}") from None


_NUMBER = re.compile(r"^-(?:\.[0-9]|[0-9])")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--lam -1`` or ``--learning_rate -1e-5``: argparse would take the value for a flag."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBER.match(token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def make_parser(algorithm: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(description=f"Train with {algorithm.upper()} on cory_env")
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--config", help="YAML file of settings (e.g. a run's config.yaml)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    parser.add_argument(
        "--algorithm", choices=sorted(ALGORITHMS), default=argparse.SUPPRESS,
        help=f"the setup to train (default {algorithm}): learners, game and defaults",
    )  # fmt: skip
    parser.add_argument(
        "--import", action="append", dest="import_modules", metavar="MODULE", default=[],
        help="a module of your own to import first (it registers learners or tasks); repeatable",
    )  # fmt: skip
    for name in [f.name for f in dataclasses.fields(TrainConfig)] + list(GAME_SETTINGS):
        if name not in ("algorithm", "game"):
            parser.add_argument(f"--{name}", type=flag_value, default=argparse.SUPPRESS)
    parser.add_argument("--game", type=flag_value, default=argparse.SUPPRESS,
                        help="game settings as a mapping; each also has its own flag")  # fmt: skip
    for name in sorted(all_learner_settings()):
        parser.add_argument(
            f"--{name}", type=flag_value, default=argparse.SUPPRESS, dest=f"learner.{name}"
        )
    # The old name of --learner, still read (with a note).
    parser.add_argument("--learner_settings", type=flag_value, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # fmt: skip
    return parser


def parse_args(
    argv: list[str] | None = None, algorithm: str = "cory"
) -> tuple[TrainConfig, Path | None]:
    """CLI: ``--preset``, ``--config``, ``--resume`` and one flag per setting.

    Learner settings are flags too (``--learning_rate 1e-5``, ``--reset_freq 17``). Values
    are read as YAML, so ``--max_new_tokens "[4, 16]"`` and ``--task_settings "{reward:
    vader}"`` work. A bad value or setting exits with one line that names it.
    """
    parser = make_parser(algorithm)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = vars(parser.parse_args(join_negative_values(argv)))
    preset, config_file, resume = args.pop("preset"), args.pop("config"), args.pop("resume")
    modules = args.pop("import_modules")
    overrides: dict[str, Any] = {}
    flagged = {}
    for key, value in args.items():
        if key.startswith("learner."):
            flagged[key.removeprefix("learner.")] = value
        else:
            overrides[key] = value
    if flagged:  # one flag per setting, over a --learner mapping
        section = overrides.get("learner") or {}
        if not isinstance(section, dict):
            parser.error(f"--learner must be a mapping of learner settings, got {section!r}")
        overrides["learner"] = {**section, **flagged}
    if resume is not None:
        if preset or config_file:
            parser.error("--resume takes the run's saved config; drop --preset/--config")
        config_file = Path(resume) / "config.yaml"
        if not config_file.is_file():
            parser.error(f"--resume {resume}: not a run folder (it has no config.yaml)")
        overrides["run_dir"] = str(resume)
    if modules:
        saved = load_config_file(config_file).get("imports", []) if config_file else []
        overrides["imports"] = [*overrides.get("imports", saved or []), *modules]
    try:
        config = build_config(preset, config_file, overrides, algorithm=algorithm)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    return config, Path(resume) if resume is not None else None
