"""Learner registry: a new learner is one file in ``agents/`` that registers itself by name.

::

    @register_learner("mine", config=MyConfig)   # config: a dataclass, or None
    class MyLearner(Learner):
        def __init__(self, seat: Seat) -> None: ...
        # act, end_rollout, learn, save, load, turn_stats (cory_rl.agents.base.Learner)

The run builds one learner per seat: ``Seat`` carries the seat's name, its validated
hyper-parameters (``seat.settings``), its tokenizer, and for LLM learners the shared
:class:`cory_rl.agents.policy.ModelPool` (``seat.model_pool``), which loads each base model once
and gives every seat of that base one frozen reference. Every module in ``agents/`` is
imported on the first look-up, so dropping a file there is all it takes; a package of
one's own registers its learners through the ``cory.learners`` entry point, or
``--import`` names its module (``cory_env/plugins.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cory_env.checks import SettingError, free_name
from cory_env.plugins import LEARNERS, import_package_modules, load_plugins
from cory_rl import agents
from cory_rl.agents.base import REQUIRED_METHODS, Learner


@dataclass
class Seat:
    """What a learner factory gets to take one seat of the game."""

    agent: str
    """The seat's agent name, e.g. ``llm_1``."""
    index: int
    n_agents: int
    settings: Any
    """The learner's hyper-parameters: an instance of its registered config class."""
    tokenizer: Any
    vocab_size: int
    pad_token_id: int
    model: str
    """The model id or path of this seat (LLM learners load it through ``model_pool``)."""
    model_pool: Any
    """The run's :class:`cory_rl.agents.policy.ModelPool` (shared by all seats)."""
    accelerator: Any
    seed: int
    group_size: int = 1
    """Each query is played ``group_size`` times in a row of the batch (group baselines)."""
    max_new_tokens: int | None = None
    """The longest answer the game allows (its budget's top; Dr. GRPO's normaliser)."""


@dataclass(frozen=True)
class LearnerSpec:
    name: str
    factory: Callable[[Seat], Learner]
    config: type | None
    description: str
    check: Callable[[Any], None] | None = None
    """Called with the run's config before any model loads; raises SettingError for a
    game this learner cannot play (e.g. group baselines need ``group_size`` >= 2)."""


_REGISTRY: dict[str, LearnerSpec] = {}
_DISCOVERED = False


def _missing_methods(cls: type) -> list[str]:
    """The required methods ``cls`` leaves as :class:`Learner`'s (which raise)."""
    return [m for m in REQUIRED_METHODS if getattr(cls, m, None) in (None, getattr(Learner, m))]


def register_learner(
    name: str,
    *,
    config: type | None = None,
    check: Callable[[Any], None] | None = None,
    replace: bool = False,
) -> Callable:
    """Decorator for a learner class (or a factory ``seat -> learner``) named ``name``.

    ``config`` is the dataclass of its hyper-parameters (``validate()`` is called if it has
    one); ``check(run_config)`` may refuse a game the learner cannot play. A class that
    is not a :class:`Learner` or leaves a required method undefined is refused here, at
    import, not mid-run; so is a name another learner holds, unless ``replace=True`` (as
    tasks are registered).
    """
    if config is not None and not dataclasses.is_dataclass(config):
        raise TypeError(f"learner {name!r}: config must be a dataclass, got {config!r}")

    def wrap(factory: Callable[[Seat], Learner]) -> Callable[[Seat], Learner]:
        if isinstance(factory, type):
            if not issubclass(factory, Learner):
                raise TypeError(
                    f"learner {name!r} ({factory.__qualname__}) is not a Learner: subclass "
                    "cory_rl.agents.base.Learner (agents/base.py)"
                )
            missing = _missing_methods(factory)
            if missing:
                raise TypeError(
                    f"learner {name!r} ({factory.__qualname__}) does not define the Learner "
                    f"methods {missing} (see agents/base.py)"
                )
        free_name(_REGISTRY, name, factory, "learner", replace, lambda spec: spec.factory)
        doc = (factory.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = LearnerSpec(name, factory, config, doc[0] if doc else "", check)
        return factory

    return wrap


def _discover() -> None:
    """Import every module of ``agents`` once, so that each registers its learners."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    import_package_modules(agents)  # as tasks are found; one that fails fails every look-up
    load_plugins(LEARNERS)
    _DISCOVERED = True


def available_learners() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def learner_spec(name: Any) -> LearnerSpec:
    """The registered learner ``name``, or an error that lists the registered ones."""
    _discover()
    if isinstance(name, str) and name not in _REGISTRY:
        load_plugins(LEARNERS, name)  # installed after the first look-up
    if not isinstance(name, str) or name not in _REGISTRY:
        raise SettingError(
            f"unknown learner {name!r}; registered learners are {available_learners()} "
            "(a new learner is one file in agents/ decorated with @register_learner)"
        )
    return _REGISTRY[name]


def learner_settings(name: str, shared: Mapping[str, Any], own: Mapping[str, Any]) -> Any:
    """The validated config of learner ``name`` for one seat.

    ``shared`` are the run's learner hyper-parameters (the ``ppo`` section, shared by all
    seats): the fields the learner's config has are taken from it. ``own`` are this
    seat's overrides; a key the learner does not know is an error.
    """
    spec = learner_spec(name)
    if spec.config is None:
        if own:
            raise SettingError(f"learner {name!r} takes no settings, got {sorted(own)}")
        return None
    known = {f.name for f in dataclasses.fields(spec.config)}
    unknown = sorted(set(own) - known)
    if unknown:
        raise SettingError(
            f"learner {name!r}: unknown settings {unknown}; its settings are {sorted(known)}"
        )
    values = {k: v for k, v in shared.items() if k in known}
    values.update(own)
    settings = spec.config(**values)
    if hasattr(settings, "validate"):
        settings.validate()
    return settings


def build_learner(name: str, seat: Seat) -> Learner:
    """Call the factory of ``name`` and check that what it returns is a learner."""
    learner = learner_spec(name).factory(seat)
    if not isinstance(learner, Learner):
        raise TypeError(
            f"learner {name!r} for {seat.agent} returned {type(learner).__name__}, which is "
            "not a Learner: subclass cory_rl.agents.base.Learner (agents/base.py)"
        )
    missing = _missing_methods(type(learner))
    if missing:
        raise TypeError(
            f"learner {name!r} for {seat.agent} returned {type(learner).__name__}, which "
            f"does not define the Learner methods {missing} (see agents/base.py)"
        )
    return learner
