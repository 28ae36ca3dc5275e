"""Resolving a config: the YAML dialect of files and flags, and the layers of settings.

Precedence, lowest first: dataclass defaults < the algorithm's < ``--preset`` (then its
``PRESET_ALGORITHM_SETTINGS``) < ``--config file.yaml`` < explicit flags. Every run saves
its resolved config as ``config.yaml`` in its run folder, and ``--config run/config.yaml``
reproduces it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from cory_env import checks
from cory_env.core import GAME_SETTINGS, GameSettings
from cory_env.plugins import import_modules
from cory_rl.agents.kl_penalty import OLD_ESTIMATORS
from cory_rl.agents.registry import available_learners, learner_spec
from cory_rl.train.config.algorithms import ALGORITHMS, algorithm_defaults
from cory_rl.train.config.presets import PRESET_ALGORITHM_SETTINGS, PRESETS
from cory_rl.train.config.train_config import TrainConfig


class _Loader(yaml.SafeLoader):
    """YAML as users type numbers: ``1e-5``, ``1E-5``, ``.5`` and ``-3`` are numbers.

    PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent, so ``1e-5``
    would be the *string* "1e-5" and crash deep inside torch's optimiser.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def parse_yaml(text: str, source: str = "") -> Any:
    """Parse YAML text with numbers read as numbers; errors name the source and the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise checks.SettingError(f"{source}{where}: not valid YAML ({problem})") from None


def _merge(
    config: TrainConfig, values: dict[str, Any], source: str, optional: set[str]
) -> TrainConfig:
    """``config`` with ``values`` layered on top. ``optional`` collects the learner settings
    that may belong to no seat's learner (an algorithm's or a preset's defaults): those are
    dropped for a run whose learners lack them, not refused."""
    known = {f.name for f in dataclasses.fields(TrainConfig)} | set(GAME_SETTINGS)
    unknown = sorted(set(values) - known)
    misplaced = [k for k in unknown if k in all_learner_settings()]
    if misplaced:
        raise checks.SettingError(
            f"{source}: {misplaced} are learner settings: give them in the 'learner' section "
            f"(learner: {{{misplaced[0]}: ...}}) or as flags (--{misplaced[0]} ...)"
        )
    if unknown:
        raise checks.SettingError(
            f"{source}: unknown settings {unknown}; known settings are {sorted(known)}"
        )
    values = _renamed_settings(dict(values), source)
    game = values.pop("game", None) or {}
    if isinstance(game, GameSettings):
        game = dataclasses.asdict(game)
    if not isinstance(game, dict):
        raise checks.fail("game", "a mapping of game settings", game, source)
    flat = {k: values.pop(k) for k in list(values) if k in GAME_SETTINGS}  # lam: -1, --lam -1
    unknown_game = sorted(set(game) - set(GAME_SETTINGS))
    if unknown_game:
        raise checks.SettingError(
            f"{source}: game: unknown settings {unknown_game}; the game's settings are "
            f"{list(GAME_SETTINGS)}"
        )
    if game or flat:
        config = dataclasses.replace(
            config, game=dataclasses.replace(config.game, **{**game, **flat})
        )
    section = values.pop("learner", None) or {}
    if not isinstance(section, dict):
        raise checks.fail("learner", "a mapping of learner settings", section, source)
    learner = {**config.learner, **section}
    optional.difference_update(section)
    return dataclasses.replace(config, **values, learner=learner)


def _renamed_settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with the learner settings that were renamed given their new names, as
    they ran: ``kl_estimator: full`` (before ``kl_penalty``) is ``kl_penalty:
    full_in_reward``, so that a saved config reproduces its run. The caller's mapping is
    left as it was given."""
    values = copy.deepcopy(values)
    section = values.get("learner")
    sections = [section] if isinstance(section, dict) else []
    seats = values.get("learners")
    if isinstance(seats, dict):
        sections += [entry for entry in seats.values() if isinstance(entry, dict)]
    for part in sections:
        if "kl_estimator" not in part:
            continue
        if "kl_penalty" in part:
            raise checks.SettingError(
                f"{source}: kl_estimator and kl_penalty both given: kl_estimator is the old "
                "name of kl_penalty; keep kl_penalty only"
            )
        old = part.pop("kl_estimator")
        part["kl_penalty"] = OLD_ESTIMATORS.get(old, old) if isinstance(old, str) else old
    return values


def _layer_defaults(
    config: TrainConfig, values: dict[str, Any], source: str, optional: set[str]
) -> TrainConfig:
    """A layer of defaults (an algorithm's, a preset's): its learner settings are optional."""
    config = _merge(config, values, source, optional)
    optional.update((values.get("learner") or {}).keys())
    return config


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise checks.SettingError(f"config file {path} is not UTF-8 text") from None
    data = parse_yaml(text, f"config file {path}") or {}
    if not isinstance(data, dict):
        raise checks.SettingError(f"config file {path} must hold a mapping of settings")
    return data


def build_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    algorithm: str = "cory",
) -> TrainConfig:
    """Resolve defaults < algorithm < preset (then its ``PRESET_ALGORITHM_SETTINGS``) < file <
    overrides into a validated config.

    ``algorithm`` is the caller's default (the script's); a file or a flag may name another,
    and the defaults of the one that wins form the layer above the dataclass defaults.
    """
    file_values = load_config_file(config_file) if config_file is not None else {}
    overrides = copy.deepcopy(overrides or {})
    algorithm = overrides.get("algorithm", file_values.get("algorithm", algorithm))
    checks.choice(algorithm, "algorithm", sorted(ALGORITHMS))
    optional: set[str] = set()
    config = _layer_defaults(
        TrainConfig(algorithm=algorithm),
        algorithm_defaults(algorithm),
        f"algorithm {algorithm!r}",
        optional,
    )
    if preset is not None:
        if preset not in PRESETS:
            raise checks.SettingError(f"unknown preset {preset!r}; presets are {sorted(PRESETS)}")
        config = _layer_defaults(
            config, copy.deepcopy(PRESETS[preset]), f"preset {preset!r}", optional
        )
        for_algorithm = PRESET_ALGORITHM_SETTINGS.get(preset, {}).get(algorithm)
        if for_algorithm:
            where = f"preset {preset!r} for {algorithm!r}"
            config = _layer_defaults(config, copy.deepcopy(for_algorithm), where, optional)
    if config_file is not None:
        config = _merge(config, file_values, f"config file {config_file}", optional)
    if overrides:
        config = _merge(config, overrides, "command line", optional)
    import_user_modules(config.imports)
    try:  # defaults for learners this run does not have are not its settings
        drop = optional - config.learner_fields()
    except (checks.SettingError, KeyError, TypeError):  # validate() says what is wrong
        drop = set()
    config.learner = {k: v for k, v in config.learner.items() if k not in drop}
    config.validate()
    config.learner = config.resolved_learner()
    return config


def import_user_modules(imports: Any) -> None:
    """Import the ``imports`` setting's modules, so that what they register is known."""
    if not isinstance(imports, list) or not all(isinstance(m, str) and m for m in imports):
        raise checks.fail("imports", "a list of module names, e.g. [my_package.learners]", imports)
    try:
        import_modules(imports)
    except ImportError as err:
        raise checks.SettingError(str(err)) from None


def all_learner_settings() -> set[str]:
    """Every setting of every registered learner: each is a flag (``--learning_rate``)."""
    configs = [learner_spec(name).config for name in available_learners()]
    return {f.name for c in configs if c is not None for f in dataclasses.fields(c)}
