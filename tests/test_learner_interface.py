"""One learner interface without exceptions: ``train/`` asks a learner what it can do through
``Learner``'s capabilities (``agents/base.py``), never by its type, and never branches on an
algorithm's name (what a setup implies is a field of its ``Algorithm``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[1] / "train"


def agent_classes(tree: ast.Module) -> set[str]:
    """The names a module imports from the learners' package (``cory_rl.agents...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cory_rl.agents"):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def exceptions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = agent_classes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            kinds = node.args[1] if len(node.args) > 1 else None
            named = [kinds] if not isinstance(kinds, ast.Tuple) else list(kinds.elts)
            for kind in named:
                if isinstance(kind, ast.Attribute):  # module.Class
                    name, owner = kind.attr, getattr(kind.value, "id", None)
                else:
                    name, owner = getattr(kind, "id", None), None
                if name in imported or owner in imported:
                    found.append(f"{path.name}:{node.lineno}: isinstance(..., {name})")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            on_algorithm = any(getattr(s, "attr", None) == "algorithm" for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            if on_algorithm and literal:
                found.append(f"{path.name}:{node.lineno}: a branch on an algorithm's name")
    return found


def test_train_asks_learners_by_capability_and_setups_by_field():
    found = [hit for path in sorted(TRAIN.rglob("*.py")) for hit in exceptions(path)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from cory_rl.agents.base import Exportable\nisinstance(learner, Exportable)\n",
        "from cory_rl.agents import ppo\nisinstance(learner, (int, ppo.PPOAgent))\n",
        "if config.algorithm == 'moe':\n    pass\n",
    ],
)
def test_the_check_finds_what_it_looks_for(tmp_path, source):
    file = tmp_path / "module.py"
    file.write_text(source)
    assert exceptions(file)


def test_capabilities_have_defaults_and_llm_learners_declare_theirs():
    import numpy as np

    from cory_rl.agents.base import RandomLearner
    from cory_rl.agents.elastic_reset import ElasticReset
    from cory_rl.agents.llm import LLMLearner

    plain = RandomLearner(vocab_size=4)
    assert not plain.takes_sampling_noise and not plain.exportable
    plain.use_sampling_noise(np.zeros((1, 2)))  # ignored: it draws its own
    with pytest.raises(NotImplementedError, match="exportable False"):
        plain.export(Path("x"), tokenizer=None)
    for cls in (LLMLearner, ElasticReset):
        assert cls.takes_sampling_noise and cls.exportable
