"""The training scripts' command line: one flag per setting, values read as YAML."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from cory_env import checks
from cory_env.core import GAME_SETTINGS, GameSettings
from cory_rl.agents.registry import available_learners, learner_spec
from cory_rl.train.commands.parser import ArgumentParser
from cory_rl.train.config.algorithms import ALGORITHMS, algorithm_defaults
from cory_rl.train.config.field_docs import (
    field_default,
    field_docs,
    field_help,
    help_line,
    show_default,
)
from cory_rl.train.config.presets import PRESETS
from cory_rl.train.config.resolve import build_config, load_config_file, parse_yaml
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


DEFAULTS_NOTE = (
    "Values are read as YAML (--max_new_tokens '[4, 16]', --task_settings '{{reward: vader}}'). "
    "The defaults shown are --algorithm {algorithm}'s; --preset, --config and another "
    "--algorithm layer theirs over them (defaults < algorithm < preset < file < flags)."
)


def _escaped(text: str) -> str:
    """Help text as argparse reads it (it formats ``%``)."""
    return text.replace("%", "%%")


def learner_configs() -> dict[str, type]:
    """Every registered learner's settings dataclass, by learner name."""
    specs = {name: learner_spec(name).config for name in available_learners()}
    return {name: config for name, config in specs.items() if config is not None}


def learner_setting_groups(configs: dict[str, type]) -> dict[tuple[str, ...], list[str]]:
    """The learner settings, grouped by the learners that have them (those of every
    learner first), each group in its configs' field order."""
    owners: dict[str, list[str]] = {}
    ordered = sorted(configs, key=lambda name: (len(configs[name].__mro__), name))
    for learner in ordered:
        for f in dataclasses.fields(configs[learner]):
            owners.setdefault(f.name, []).append(learner)
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, learners in owners.items():
        groups.setdefault(tuple(learners), []).append(name)
    return dict(sorted(groups.items(), key=lambda item: -len(item[0])))


def learner_setting_help(
    name: str, learners: tuple[str, ...], configs: dict[str, type], algorithm: str
) -> str:
    """A learner setting's help: its documentation (the algorithm's own learner's first)
    and its default for this algorithm, per learner where they differ."""
    algo = ALGORITHMS[algorithm]
    readers = sorted(learners, key=lambda learner: learner != algo.seat_learner)
    docs = [field_docs(configs[r]).get(name) for r in readers]
    defaults: dict[str, list[str]] = {}
    for learner in readers:
        value = algo.learner.get(name, field_default(configs[learner], name))
        text = "none (required)" if value is dataclasses.MISSING else show_default(value)
        defaults.setdefault(text, []).append(learner)
    if len(defaults) == 1:
        shown = next(iter(defaults))
    else:
        shown = "; ".join(f"{value} for {', '.join(who)}" for value, who in defaults.items())
    return help_line(next((doc for doc in docs if doc), ""), shown)  # shown: already text


class OneImportFlag(argparse.Action):
    """``--imports``: refused, naming the one flag of the setting, ``--import``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error("--imports: the flag is --import MODULE, once per module")


def make_parser(algorithm: str) -> argparse.ArgumentParser:
    """The training command's parser: one flag per setting, each with its field's
    documentation (``cory_rl.train.config.field_docs``) and its default under ``algorithm``
    as help."""
    parser = ArgumentParser(
        description=f"Train with {algorithm.upper()} on cory_env.",
        epilog=_escaped(DEFAULTS_NOTE.format(algorithm=algorithm)),
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="named settings layered over the algorithm's defaults, from "
        "cory_rl.train.config.presets (default: None)",
    )
    parser.add_argument(
        "--config", help="YAML file of settings, e.g. a run's config.yaml (default: None)"
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its checkpoint, with its saved config (default: None)",
    )
    parser.add_argument(
        "--algorithm",
        choices=sorted(ALGORITHMS),
        default=argparse.SUPPRESS,
        help=_escaped(field_help(TrainConfig, "algorithm", algorithm)),
    )
    parser.add_argument(  # the flag of the setting ``imports``: one module a flag
        "--import",
        action="append",
        dest="import_modules",
        metavar="MODULE",
        default=[],
        help=_escaped(
            field_help(TrainConfig, "imports", []).replace(" (default:", " Repeatable (default:")
        ),
    )
    parser.add_argument(
        "--imports", action=OneImportFlag, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    layer = algorithm_defaults(algorithm)
    game = dataclasses.replace(
        GameSettings(), **{k: v for k, v in layer.items() if k in GAME_SETTINGS}
    )
    run = parser.add_argument_group("run settings (TrainConfig)")
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("algorithm", "imports"):  # their flags are above
            continue
        default = {"game": dataclasses.asdict(game), "learner": layer["learner"]}.get(
            f.name, field_default(TrainConfig, f.name)
        )
        run.add_argument(
            f"--{f.name}",
            type=flag_value,
            default=argparse.SUPPRESS,
            help=_escaped(field_help(TrainConfig, f.name, default)),
        )
    played = parser.add_argument_group(
        "game settings (cory_env.core.GameSettings; also the keys of --game)"
    )
    for name in GAME_SETTINGS:
        played.add_argument(
            f"--{name}",
            type=flag_value,
            default=argparse.SUPPRESS,
            help=_escaped(field_help(GameSettings, name, getattr(game, name))),
        )
    configs = learner_configs()
    for learners, names in learner_setting_groups(configs).items():
        every = len(learners) == len(configs)
        title = "every learner" if every else ", ".join(sorted(learners))
        group = parser.add_argument_group(f"learner settings: {title} (also the keys of --learner)")
        for name in names:
            group.add_argument(
                f"--{name}",
                type=flag_value,
                default=argparse.SUPPRESS,
                dest=f"learner.{name}",
                metavar=name.upper(),
                help=_escaped(learner_setting_help(name, learners, configs, algorithm)),
            )
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
