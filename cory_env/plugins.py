"""Learners and tasks: found by their module's presence, or in the user's own packages.

Both are found the same way. A module in the project's folder of them (``agents/`` for
learners, ``cory_env/tasks/`` for tasks) is imported by :func:`import_package_modules`
and registers what it holds: dropping a file there is all it takes. A package of one's own
makes its learners or tasks known through an entry point: in its
``pyproject.toml``::

    [project.entry-points."cory.learners"]
    mine = "my_package.learners"      # importing the module registers the learner "mine"

    [project.entry-points."cory.tasks"]
    reviews = "my_package.tasks"

The registries load a plugin the first time its name is asked for (or when all names are
listed). A module that is not installed can be named on the command line instead
(``--import my_package.learners``, ``cory_rl.train.config.resolve``).
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from types import ModuleType

LEARNERS, TASKS = "cory.learners", "cory.tasks"
"""The entry-point groups."""


def import_package_modules(package: ModuleType) -> list[str]:
    """Import every module of ``package`` (those whose name starts with ``_`` excepted):
    each registers the learners or tasks it holds. Returns their names. A module that
    fails to import raises, naming itself in the traceback."""
    names = []
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
            names.append(module.name)
    return names


def load_plugins(group: str, name: str | None = None) -> list[str]:
    """Import the plugins of ``group`` (those named ``name``, or all): their modules
    register what they hold. Returns the names of the entry points loaded."""
    loaded = []
    for point in entry_points(group=group):
        if name is None or point.name == name:
            point.load()
            loaded.append(point.name)
    return loaded


def import_modules(modules: list[str]) -> None:
    """Import the user's modules named by ``--import`` (they register learners or tasks);
    a module that cannot be imported raises ``ImportError`` saying which and why."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ImportError(
                f"imports: cannot import {module!r} ({err}); it must be importable from here "
                "(installed, or on PYTHONPATH)"
            ) from err
