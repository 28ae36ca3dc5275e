"""The house has one direction: every import points down the layers (docs/architecture.md).

Read from the source with ``ast`` (nothing is imported): a module of a lower layer that
imports one of a higher layer, an import circle, a project import hidden inside a function,
or a new module of ``train/`` that no layer names each fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# fmt: off
TRAIN_LAYERS: list[tuple[str, set[str]]] = [
    # lowest first; a module may import its own layer and the ones below
    ("leaves", {"arguments", "files", "memory", "allocator", "algorithms", "distributed", "hub",
                "tracker_setup", "metrics", "presets", "callbacks", "eval_set", "errors",
                "stopping"}),
    ("core", {"config", "settings", "results", "checkpoint", "run_folder", "games", "build",
              "trained"}),
    ("training", {"health", "loop", "trackers"}),
    ("evaluation", {"eval_report", "evaluator", "eval_along", "cross_play"}),
    ("analysis", {"plots", "run_summary", "model_card", "comparison", "comparison_figures"}),
    ("commands", {"flags", "run", "cory", "ppo", "evaluate", "eval_saved", "export", "play",
                  "sweep", "compare", "cli", "__init__", "tuning"}),
]
# fmt: on
PACKAGES = {"cory_env": "cory_env", "agents": "cory_rl.agents", "train": "cory_rl.train"}
"""Each folder and its import name, lowest first: cory_env imports neither of the others,
agents not train."""
ORDER = list(PACKAGES.values())
LAZY = {"cory_rl.train.cli"}
"""Modules that may import the project inside functions: the console scripts' entry points,
so that ``cory-train --help`` does not import torch for ``cory-compare``."""


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([PACKAGES[folder], *rest])


def package_of(module: str) -> str:
    return next(name for name in reversed(ORDER) if module.startswith(name + "."))


def project_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module imported, line, at the top of the file) for every import of the project."""
    tree = ast.parse(path.read_text())
    # the top of the file: its statements, and those of a top-level ``if TYPE_CHECKING:``
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, ast.If) for n in node.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in (*PACKAGES, "cory_rl"):
                found.append((name, node.lineno, id(node) in top))
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in PACKAGES for p in sorted((ROOT / folder).rglob("*.py"))}


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name belongs to (``cory_rl.train.loop.train``: its loop)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name, _, _ in project_imports(path):
            target = resolve(name, known)
            if target is not None and target != module and not target.endswith("__init__"):
                edges[module].add(target)
    return edges


def train_layer(module: str) -> int:
    short = module.removeprefix("cory_rl.train.")
    for rank, (_, names) in enumerate(TRAIN_LAYERS):
        if short in names:
            return rank
    raise AssertionError(
        f"{module} is in no layer of tests/test_layers.py: add it to the layer it belongs to"
    )


def test_every_module_of_train_has_a_layer():
    for module in modules():
        if module.startswith("cory_rl.train."):
            train_layer(module)


def test_no_import_points_up():
    known = modules()
    wrong = []
    for module, path in known.items():
        package = ORDER.index(package_of(module))
        for name, line, _ in project_imports(path):
            target = resolve(name, known)
            if target is None:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if ORDER.index(package_of(target)) > package:
                wrong.append(f"{where} (a higher package)")
            elif module.startswith("cory_rl.train.") and target.startswith("cory_rl.train."):
                if train_layer(target) > train_layer(module):
                    high, low = (
                        TRAIN_LAYERS[train_layer(target)][0],
                        TRAIN_LAYERS[train_layer(module)][0],
                    )
                    wrong.append(f"{where} ({high} above {low})")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_imports_are_at_the_top_of_each_file():
    hidden = [
        f"{path.relative_to(ROOT)}:{line} imports {name} inside a function"
        for module, path in modules().items()
        if module not in LAZY
        for name, line, at_top in project_imports(path)
        if not at_top
    ]
    assert not hidden, "\n".join(hidden)


def test_there_is_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circle = stack[stack.index(target) :] + [target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_the_project_is_imported_by_its_installed_names_only():
    """``agents.x`` or ``train.x`` would load a second copy of a module (or another
    package's ``agents``): every import of the project names ``cory_rl.agents`` or
    ``cory_rl.train``. Tests, benchmarks and examples included."""
    files = [p for folder in (*PACKAGES, "tests", "bench", "examples")
             for p in sorted((ROOT / folder).rglob("*.py"))]  # fmt: skip
    bare = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for name, line, _ in project_imports(path)
        if name.split(".")[0] in ("agents", "train")
    ]
    assert not bare, "\n".join(bare)


def test_the_guard_sees_an_import_that_points_up(tmp_path, monkeypatch):
    """The guard itself: a planted upward import is found."""
    planted = ROOT / "train" / "files.py"
    copy = tmp_path / "files.py"
    copy.write_text(planted.read_text() + "\nfrom cory_rl.train.loop import train  # planted\n")
    original = project_imports
    monkeypatch.setitem(
        globals(), "project_imports", lambda path: original(copy if path == planted else path)
    )
    with pytest.raises(AssertionError, match=r"train/files.py:\d+ imports cory_rl.train.loop"):
        test_no_import_points_up()
