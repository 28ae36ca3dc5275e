"""One way to register a plug-in: tasks are found as learners are, by their module's
presence in the project's folder of them (``cory_env.plugins.import_package_modules``), and a
user's own task file or package through ``--import`` (or the ``cory.tasks`` entry point,
tests/test_trust.py), as a user's learner is."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import cory_env
import cory_env.tasks
from cory_env.plugins import import_package_modules
from cory_env.tasks import make_task, registry
from cory_rl import agents
from cory_rl.agents import registry as learner_registry

TASK_FILE = textwrap.dedent('''
    from cory_env import custom_task, register_task


    @register_task("{name}")
    def make(n_queries: int = 2):
        """A task of one's own."""
        return custom_task(["the movie", "a film"][:n_queries], lambda q, r: [1.0] * len(r))
''')


OWN_MODULES = ("my_package", "cory_env.tasks.dropped_mine")
"""The modules the tests write."""


@pytest.fixture()
def scratch(monkeypatch):
    """Tasks and modules a test adds are gone after it."""
    tasks, learners = dict(registry._REGISTRY), dict(learner_registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(tasks)
    learner_registry._REGISTRY.clear()
    learner_registry._REGISTRY.update(learners)
    for name in [m for m in sys.modules if m.startswith(OWN_MODULES)]:
        sys.modules.pop(name)


def modules_in(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}


def test_every_module_in_the_folders_is_imported() -> None:
    """No hand-kept list: every module of cory_env/tasks/ is imported with cory_env, every
    module of agents/ on the first look-up of a learner."""
    learner_registry.available_learners()
    for package in (cory_env.tasks, agents):
        folder = Path(package.__file__).parent
        names = {f"{package.__name__}.{stem}" for stem in modules_in(folder)}
        assert names and names <= set(sys.modules), names - set(sys.modules)
    source = Path(cory_env.tasks.__file__).read_text(encoding="utf-8")
    assert "import arith" not in source and "imdb," not in source  # the old list is gone


def test_a_task_file_dropped_into_the_tasks_folder_is_found(
    tmp_path, monkeypatch, scratch, tiny_tokenizer
) -> None:
    """The folder is cory_env/tasks/ and a second folder of the same package here, so that
    the test writes nothing into the project."""
    (tmp_path / "dropped_mine.py").write_text(TASK_FILE.format(name="dropped_mine"))
    monkeypatch.setattr(cory_env.tasks, "__path__", [*cory_env.tasks.__path__, str(tmp_path)])
    assert "dropped_mine" not in cory_env.available_tasks()
    assert "dropped_mine" in import_package_modules(cory_env.tasks)
    assert "dropped_mine" in cory_env.available_tasks()
    assert sys.modules["cory_env.tasks.dropped_mine"]
    task = make_task("dropped_mine", n_queries=1)
    assert [q.text for q in task.queries] == ["the movie"]
    game = cory_env.batched_game("dropped_mine", batch_size=2, tokenizer=tiny_tokenizer)
    game.reset(seed=0)


def test_a_task_package_of_one_s_own_is_found_by_import(tmp_path, monkeypatch, scratch) -> None:
    """``--import my_package.tasks``, as a learner of one's own: the command finds the task,
    and the package's folder is scanned the same way the project's are."""
    from cory_rl.train.commands.train_flags import parse_args

    package = tmp_path / "my_package"
    (package / "tasks").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks" / "__init__.py").write_text(
        "import sys\n\nfrom cory_env.plugins import import_package_modules\n\n"
        "import_package_modules(sys.modules[__name__])\n"
    )
    (package / "tasks" / "reviews.py").write_text(TASK_FILE.format(name="my_reviews"))
    (package / "tasks" / "more.py").write_text(TASK_FILE.format(name="my_more"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "my_reviews" not in cory_env.available_tasks()
    config, _ = parse_args(
        ["--preset", "smoke", "--import", "my_package.tasks", "--task", "my_reviews"], "cory"
    )
    assert config.imports == ["my_package.tasks"] and config.task == "my_reviews"
    assert {"my_reviews", "my_more"} <= set(cory_env.available_tasks())
    assert make_task("my_more").name == "custom"


def test_one_flag_for_imports(capsys) -> None:
    """``--import MODULE`` is the flag of the setting ``imports``; ``--imports`` is refused in
    one line that names it."""
    from cory_rl.train.commands.train_flags import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--preset", "smoke", "--imports", "[my_package.tasks]"], "cory")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "--imports: the flag is --import MODULE" in lines[0] and "usage:" not in lines[0]
    config, _ = parse_args(["--preset", "smoke", "--import", "json", "--import", "csv"], "cory")
    assert config.imports == ["json", "csv"]
