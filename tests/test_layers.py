"""The house has one direction: every import points down the layers (docs/architecture.md).

Read from the source with ``ast`` (nothing is imported). A module's layer is its folder:
``cory_env`` < ``cory_rl.agents`` < ``cory_rl.train``, and inside ``train/`` the folders of
``TRAIN_LAYERS``, lowest first, under the entry files at ``train/``'s root and the package
``cory_rl`` (``train/api/``). Every import of the project counts: ``import``, ``from ...
import``, relative imports (resolved, and refused: the project names itself by its
installed names), a package itself (``import cory_rl.train``, ``from cory_rl import
agents``) and ``importlib.import_module`` / ``__import__`` of a literal name. An import
that points up, an import circle, a project import hidden inside a function and a folder
of ``train/`` that no layer names each fail here with the file and line; the last tests
plant each kind of import and see the guard fail.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN_LAYERS = ["config", "core", "evaluation", "analysis", "training", "publish", "commands"]
"""The folders of ``train/``, lowest first; a module may import its own folder and those
below. The files at ``train/``'s root (the entry files) and ``train/api/`` (the package
``cory_rl``) are above them all."""
TOP = len(TRAIN_LAYERS)
PACKAGES = {"cory_env": "cory_env", "agents": "cory_rl.agents", "train": "cory_rl.train"}
"""Each folder and its import name, lowest first: cory_env imports neither of the others,
agents not train."""
ORDER = [*PACKAGES.values(), "cory_rl"]
LAZY = {"cory_rl.train.commands.cli", "cory_rl"}
"""Modules that may import the project inside functions: the console scripts' entry points,
so that ``cory-compare --help`` does not import torch for ``cory-train``, and the package
``cory_rl``, which every ``import cory_rl.agents...`` runs first: it imports its API on first
use, so that a learner's import does not import training."""
PROJECT = ("cory_env", "cory_rl", "agents", "train")
"""First names of the project's imports (``agents``/``train``: bare names, refused below)."""


def module_name(path: Path) -> str:
    """The installed name of a file; a package's ``__init__`` is the package itself."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[:2] == ["train", "api"]:
        parts = ["cory_rl", *parts[2:]]
    elif parts[0] in PACKAGES:
        parts = [*PACKAGES[parts[0]].split("."), *parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The package of ``ORDER`` a module belongs to (the longest that names it)."""
    owners = [name for name in ORDER if module == name or module.startswith(name + ".")]
    return max(owners, key=len)


def _literal_import(node: ast.AST) -> str | None:
    """The project module named by ``importlib.import_module("...")`` or ``__import__("...")``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
        if isinstance(first.value, str) and first.value.split(".")[0] in PROJECT:
            return first.value
    return None


PLANTED: dict[Path, str] = {}
"""Sources read instead of a file's own (the planted imports of the last test)."""


def project_imports(path: Path) -> list[tuple[str, int, bool, str]]:
    """(module imported, line, at the top of the file, kind) for every import of the
    project; kind is ``plain``, ``relative`` or ``dynamic``."""
    tree = ast.parse(PLANTED.get(path) or path.read_text())
    # the top of the file: its statements, and those of a top-level ``if`` (TYPE_CHECKING)
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, ast.If) for n in node.body}
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        kind = "plain"
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kind = "relative"
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            members = [f"{base}.{a.name}" for a in node.names]
            # ``from package import module``: the module is what is imported (the package
            # runs first whatever the import, so it does not count)
            names = members if any(m in modules() for m in members) else [base, *members]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif (dynamic := _literal_import(node)) is not None:
            names, kind = [dynamic], "dynamic"
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT:
                found.append((name, node.lineno, id(node) in top and kind != "dynamic", kind))
    return found


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in PACKAGES for p in sorted((ROOT / folder).rglob("*.py"))}


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name belongs to (``cory_rl.train.training.loop.train``:
    its loop; ``cory_rl.agents``: the package itself)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def train_layer(module: str) -> int:
    """The rank of a module of ``cory_rl.train`` (or of ``cory_rl``): its folder's."""
    if module == "cory_rl" or module.startswith("cory_rl.train.api"):
        return TOP
    parts = module.removeprefix("cory_rl.train").strip(".").split(".")
    if not parts[0] or not (ROOT / "train" / parts[0]).is_dir():  # train/'s root: its files
        return TOP
    if parts[0] not in TRAIN_LAYERS:
        raise AssertionError(
            f"{module}: train/{parts[0]}/ is in no layer of tests/test_layers.py: add the "
            "folder to TRAIN_LAYERS where it belongs"
        )
    return TRAIN_LAYERS.index(parts[0])


def upward_imports(known: dict[str, Path]) -> list[str]:
    wrong = []
    for module, path in known.items():
        rank = ORDER.index(package_of(module))
        for name, line, _, _ in project_imports(path):
            target = resolve(name, known)
            if target is None or target == module:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if ORDER.index(package_of(target)) > rank:
                wrong.append(f"{where} (a higher package)")
            elif package_of(module) in ("cory_rl.train", "cory_rl") and package_of(target) in (
                "cory_rl.train",
                "cory_rl",
            ):
                if train_layer(target) > train_layer(module):
                    wrong.append(f"{where} (a higher layer)")
    return wrong


def hidden_imports(known: dict[str, Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name} inside a function or by name"
        for module, path in known.items()
        if module not in LAZY
        for name, line, at_top, _ in project_imports(path)
        if not at_top
    ]


def test_every_folder_of_train_is_a_layer():
    for module in modules():
        if module.startswith("cory_rl.train") or module == "cory_rl":
            train_layer(module)


def test_no_import_points_up():
    wrong = upward_imports(modules())
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_imports_are_at_the_top_of_each_file():
    hidden = hidden_imports(modules())
    assert not hidden, "\n".join(hidden)


def test_there_is_no_import_circle():
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name, _, _, _ in project_imports(path):
            target = resolve(name, known)
            if target is not None and target != module and module not in (target,):
                if not module.startswith(target + "."):  # a module and its own package
                    edges[module].add(target)
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


def named_imports(files: list[Path]) -> list[str]:
    """Imports that do not name the project by its installed names: ``agents.x``/``train.x``
    (a second copy of a module from a checkout, or another package's) and relative ones."""
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        + (" (relative: name it cory_rl.* or cory_env.*)" if kind == "relative" else "")
        for path in files
        for name, line, _, kind in project_imports(path)
        if name.split(".")[0] in ("agents", "train") or kind == "relative"
    ]


def test_the_project_is_imported_by_its_installed_names_only():
    """Every import of the project names ``cory_env``, ``cory_rl.agents`` or
    ``cory_rl.train``, absolutely. Tests, benchmarks and examples included."""
    files = [
        p
        for folder in (*PACKAGES, "tests", "bench", "examples")
        for p in sorted((ROOT / folder).rglob("*.py"))
    ]
    bare = named_imports(files)
    assert not bare, "\n".join(bare)


# ---------------------------------------------------------------- the guard, planted
PLANTS = {
    "upward": ("train/config/files.py", "from cory_rl.train.training.loop import train\n"),
    "relative": ("train/config/files.py", "from ..training.loop import train\n"),
    "import_module": (
        "train/config/files.py",
        "import importlib\nloop = importlib.import_module('cory_rl.train.training.loop')\n",
    ),
    "__import__": ("train/core/games.py", "loop = __import__('cory_rl.train.training.loop')\n"),
    "agents_imports_train": ("agents/base.py", "import cory_rl.train\n"),
    "env_imports_agents": ("cory_env/checks.py", "from cory_rl import agents\n"),
    "hidden": ("train/core/games.py", "def late():\n    from cory_rl.train.core import build\n"),
}


@pytest.mark.parametrize("kind", list(PLANTS))
def test_the_guard_fails_on_every_kind_of_planted_import(kind, monkeypatch):
    file, planted = PLANTS[kind]
    path = ROOT / file
    known = modules()

    def failures() -> list[str]:
        found = upward_imports(known) + hidden_imports(known) + named_imports([path])
        return [f for f in found if f.startswith(file)]

    assert not failures()
    monkeypatch.setitem(PLANTED, path, path.read_text() + "\n" + planted)
    assert failures(), f"the guard missed a planted {kind} import"


def test_no_module_of_the_layers_is_over_450_lines():
    """Small modules with one job: a file that grows past 450 lines splits where it divides."""
    long = {
        str(path.relative_to(ROOT)): n
        for folder in ("cory_env", "agents", "train")
        for path in (ROOT / folder).rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 450
    }
    assert not long, long


def test_the_readme_stays_a_readme():
    """300 lines at most: the detail lives in docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
