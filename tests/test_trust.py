"""Mistakes on the command line: one line that says what to do, before any model loads, and
nothing of value overwritten; learners and tasks from a package of one's own."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from cory_rl.train.commands import compare as compare_script
from cory_rl.train.commands import evaluate, export, plots, sweep
from cory_rl.train.commands import train as run
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.evaluation import evaluator
from tests.conftest import read_jsonl, tiny_config


def one_line_error(capsys) -> str:
    """The script's error: one line naming the mistake, a pointer to --help, no usage block."""
    err = capsys.readouterr().err
    assert "usage:" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) <= 2 and (len(lines) == 1 or "--help" in lines[1]), err
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n_agents", "2"], "plays 1 seat: it is a single-agent baseline"),
        (["--task", "nope"], "unknown task 'nope'; registered tasks are"),
        (["--task_settings", "{foo: 1}"], "task 'imdb' has no settings ['foo']; its settings"),
        (["--task_settings", "{lam: 1}"], "settings of the game, not of the task"),
        (["--learners", "{llm_0: {learning_rate: 1e-4}}"], "the 'learner:' key is missing"),
        (["--batch_size", "x"], "batch_size must be an integer"),
        (["--import", "no_such_module_here"], "cannot import 'no_such_module_here'"),
    ],
)
def test_a_bad_training_flag_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(flags, "ppo")
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"llm_1": "/no/such/model"}, "models.llm_1: '/no/such/model' is no local folder"),
        ({"llm_1": "no-org/no-such-model"}, "the hub is offline (HF_HUB_OFFLINE)"),
    ],
)
def test_a_model_that_is_not_there_is_named_with_its_seat_before_any_load(
    tiny_model_dir, tmp_path, no_model_load, monkeypatch, models, message
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    flags = [
        "--model",
        tiny_model_dir,
        "--models",
        json.dumps(models),
        "--run_dir",
        str(tmp_path / "run"),
        "--preset",
        "smoke",
    ]
    with pytest.raises(SystemExit) as exit_:
        run.main("cory", flags)
    assert message in str(exit_.value) and len(str(exit_.value).splitlines()) == 1
    assert "use 'embedded'" in str(exit_.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_one_is_one_line(tiny_model_dir, tmp_path, no_model_load):
    flags = ["--model", tiny_model_dir, "--device", "cuda", "--run_dir", str(tmp_path / "r")]
    with pytest.raises(SystemExit, match="no CUDA device is visible"):
        run.main("ppo", flags)


def test_plots_and_compare_of_a_missing_run_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plots.main([str(tmp_path / "nothing")])
    assert "not a run folder" in one_line_error(capsys)
    with pytest.raises(SystemExit):
        compare_script.main([str(tmp_path / "nothing")])
    assert "neither a run folder" in one_line_error(capsys)


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("trust") / "ppo"
    run.run_training(tiny_config(tiny_model_dir, path, "ppo", iterations=2))
    return path


def test_export_checks_its_output_before_loading_and_swaps_folders_in(ppo_run, tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("keep me")
    with pytest.raises(SystemExit):
        export.main([str(ppo_run), str(file)])
    assert "is a file, not a folder" in one_line_error(capsys) and file.read_text() == "keep me"
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        export.main([str(ppo_run), str(used)])
    assert "--overwrite" in one_line_error(capsys)
    export.main([str(ppo_run), str(used), "--overwrite"])
    export.main([str(ppo_run), str(used), "--overwrite"])  # replaces its own export
    assert (used / "llm_0" / "config.json").is_file() and (used / "notes.txt").exists()
    assert not list(used.glob("*.partial")) and not list(used.glob("*.old"))


def test_evaluation_options_are_checked_before_loading(ppo_run, no_model_load, capsys):
    for flags in (["--samples", "0"], ["--samples", "x"], ["--max_queries", "-1"]):
        with pytest.raises(SystemExit):
            evaluate.main([str(ppo_run), *flags])
        one_line_error(capsys)


def test_a_run_killed_before_its_first_checkpoint_starts_again_in_its_folder(
    tiny_model_dir, tmp_path, capsys
):
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.yaml").write_text("algorithm: ppo\n")
    (path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    (path / "checkpoint.tmp").mkdir()  # the first write, cut short: no state.json
    config, resume = parse_args(["--resume", str(path)], "ppo")
    with pytest.raises(FileNotFoundError, match="without --resume"):
        run.run_training(config, resume)
    again = run.run_training(tiny_config(tiny_model_dir, path, "ppo", iterations=1))
    assert "starting it again" in capsys.readouterr().out
    assert [r["iteration"] for r in read_jsonl(again.path / "metrics.jsonl")] == [0]
    # A folder with files no run writes is never deleted.
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text("")
    (other / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="thesis.tex"):
        run.run_training(tiny_config(tiny_model_dir, other, "ppo", iterations=1))
    assert (other / "thesis.tex").read_text() == "precious"


def test_resuming_a_finished_run_with_fewer_iterations_says_there_is_nothing_to_do(ppo_run, capsys):
    before = (ppo_run / "metrics.jsonl").read_bytes()
    config, resume = parse_args(["--resume", str(ppo_run), "--iterations", "1"], "ppo")
    assert run.run_training(config, resume) is None
    assert "nothing to do" in capsys.readouterr().out
    assert (ppo_run / "metrics.jsonl").read_bytes() == before


def test_a_sweep_refused_for_its_settings_does_not_say_rerun(tiny_model_dir, tmp_path, capsys):
    flags = [
        "--algorithms",
        "ppo",
        "--setting",
        "batch_size",
        "--values",
        "0",
        "--out",
        str(tmp_path / "s"),
        "--model",
        tiny_model_dir,
    ]
    with pytest.raises(SystemExit):
        sweep.main(flags)
    out = capsys.readouterr()
    assert "fix the command" in out.out and "rerun the same command" not in out.out


def test_the_summary_of_a_short_run_says_what_it_is_and_what_next(ppo_run):
    from cory_rl.train.analysis.run_summary import run_summary

    text = run_summary(ppo_run)
    assert "test the plumbing" in text and "score: the task's reward" in text
    assert f"python train/evaluate.py {ppo_run}" in text and "delete" in text


PLUGIN = '''
import numpy as np

from cory_rl.agents.base import RandomLearner
from cory_rl.agents.registry import register_learner
from cory_env import custom_task, register_task


@register_learner("{name}")
def make(seat):
    """Random tokens, from a package of one's own."""
    return RandomLearner(seat.vocab_size, seat.seed)


@register_task("{name}_task")
def make_task(n_queries: int = 3):
    return custom_task(["is a", "the movie"][:n_queries], lambda q, r: [0.5] * len(r))
'''


def test_learners_and_tasks_from_a_module_of_one_s_own(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_learners.py").write_text(PLUGIN.format(name="mine"))
    flags = [
        "--import",
        "my_learners",
        "--model",
        tiny_model_dir,
        "--preset",
        "smoke",
        "--batch_size",
        "2",
        "--mini_batch_size",
        "2",
        "--iterations",
        "1",
        "--learners",
        "{llm_0: ppo, llm_1: mine}",
        "--task",
        "mine_task",
        "--run_dir",
        str(tmp_path / "run"),
        "--device",
        "cpu",
    ]
    config, _ = parse_args(flags, "cory")
    assert config.imports == ["my_learners"] and config.task == "mine_task"
    finished = run.run_training(config)
    saved = read_jsonl(finished.path / "metrics.jsonl")[0]
    assert "llm_1/kl" not in saved and "llm_0/kl" in saved  # a learner with no reference
    from cory_rl.train.analysis.run_summary import run_summary

    assert "n/a (no reference)" in run_summary(finished.path)
    # The saved config imports the module again: the run resumes and evaluates as it is.
    config, resume = parse_args(["--resume", str(finished.path), "--iterations", "2"], "cory")
    run.run_training(config, resume)
    result = evaluator.evaluate_run(finished.path, samples=1)
    assert "untrained copy" in result["reference_is"]["llm_1"]
    assert result["reference_is"]["llm_0"] == evaluator.BASE_MODEL


def test_a_learner_from_an_installed_package_s_entry_point(tmp_path, monkeypatch):
    from cory_rl.agents.registry import learner_spec

    site = tmp_path / "site"
    (site / "plugged-0.1.dist-info").mkdir(parents=True)
    (site / "plugged-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plugged\nVersion: 0.1\n"
    )
    (site / "plugged-0.1.dist-info" / "entry_points.txt").write_text(
        textwrap.dedent("""
        [cory.learners]
        plugged = plugged_learners

        [cory.tasks]
        plugged_task = plugged_learners
        """)
    )
    (site / "plugged_learners.py").write_text(PLUGIN.format(name="plugged"))
    monkeypatch.syspath_prepend(str(site))
    assert learner_spec("plugged").description == "Random tokens, from a package of one's own."
    from cory_env.tasks import make_task

    assert make_task("plugged_task").queries[0].text == "is a"
    sys.modules.pop("plugged_learners", None)


def test_files_written_over_are_written_beside_and_swapped_in(tmp_path):
    from cory_rl.train.config.files import write_beside, write_text

    target = tmp_path / "config.yaml"
    write_text(target, "old: 1\n")

    def crash(tmp):
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_beside(target, crash)
    assert target.read_text() == "old: 1\n"  # the previous file is whole
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # nothing half left
    write_text(target, "new: 2\n")
    assert target.read_text() == "new: 2\n"


def test_bf16_on_a_cpu_without_bf16_instructions_is_named(tiny_model_dir, tmp_path, monkeypatch):
    import torch

    from cory_rl.train.core import build

    assert isinstance(build.cpu_has_bf16(), bool)
    bf16 = tiny_config(tiny_model_dir, tmp_path / "run", mixed_precision="bf16")
    fp32 = tiny_config(tiny_model_dir, tmp_path / "run")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(build, "cpu_has_bf16", lambda: False)
    message = build.emulated_bf16_warning(bf16, use_cpu=True)
    assert "bf16 on a CPU without bfloat16 instructions (torch sees AVX2)" in message
    assert "mixed_precision no" in message
    assert build.emulated_bf16_warning(fp32, use_cpu=True) is None
    assert build.emulated_bf16_warning(bf16, use_cpu=False) is None  # a GPU run
    monkeypatch.setattr(build, "cpu_has_bf16", lambda: True)
    assert build.emulated_bf16_warning(bf16, use_cpu=True) is None


def test_fsdp2_in_one_plain_process_says_it_shards_nothing(tiny_model_dir, tmp_path, capsys):
    from cory_rl.train.core.build import make_accelerator, make_sharding

    config = tiny_config(tiny_model_dir, tmp_path / "run", sharding="fsdp2")
    assert make_sharding(config, make_accelerator(config)) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FSDP2 in one process shards nothing" in err[0]
    assert "accelerate launch --config_file train/configs/fsdp2.yaml" in err[0]
    config = tiny_config(tiny_model_dir, tmp_path / "run", sharding="none")
    assert make_sharding(config, make_accelerator(config)) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["/no/such", "--like", "/no/such"], "argument saved: /no/such: no such folder"),
        (["SAVED", "--like", "/no/such"], "argument --like: /no/such: no such folder"),
        (["SAVED", "--like", "A_FILE"], "argument --like: A_FILE is a file, not a folder"),
        (["SAVED", "--like", "RUN", "--out", "A_FILE/x"], "--out: A_FILE/x: A_FILE is a file"),
        (["SAVED", "--like", "SAVED"], "SAVED: not a run folder (it has no config.yaml)"),
        (["SAVED", "--like", "RUN"], "SAVED: no updates_000000 folder"),
    ],
)
def test_eval_saved_with_a_wrong_path_is_one_line(ppo_run, tmp_path, capsys, flags, message):
    from cory_rl.train.commands import eval_saved

    (tmp_path / "saved").mkdir()
    (tmp_path / "file").write_text("keep me")
    names = {"SAVED": str(tmp_path / "saved"), "A_FILE": str(tmp_path / "file")}
    names["RUN"] = str(ppo_run)
    argv = [names.get(f, f).replace("A_FILE", names["A_FILE"]) for f in flags]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        eval_saved.main([*argv, "--seed", "0"])
    expected = message.replace("A_FILE", names["A_FILE"]).replace("SAVED", names["SAVED"])
    assert expected in one_line_error(capsys)


def test_a_folder_to_write_under_a_file_is_one_line(ppo_run, tmp_path, capsys):
    under = str(tmp_path / "file" / "out")
    (tmp_path / "file").write_text("keep me")
    for command, argv in [
        (compare_script.main, [str(ppo_run), "--out", under]),
        (evaluate.main, [str(ppo_run), "--out", under]),
        (export.main, [str(ppo_run), under]),
        (sweep.main, ["--algorithms", "ppo", "--out", under]),
    ]:
        with pytest.raises(SystemExit):
            command(argv)
        assert f"{under}: {tmp_path / 'file'} is a file, not a folder" in one_line_error(capsys)


def test_a_run_folder_under_a_file_is_refused_before_any_model_loads(
    tiny_model_dir, tmp_path, no_model_load
):
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(SystemExit) as exit_:
        run.main("ppo", ["--model", tiny_model_dir, "--run_dir", str(tmp_path / "file" / "run")])
    assert f"{tmp_path / 'file'} is a file, not a folder; pick another path" in str(exit_.value)


def test_a_file_of_a_run_that_cannot_be_read_is_one_line(ppo_run, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ppo_run, broken)
    (broken / "metrics.jsonl").unlink()
    (broken / "metrics.jsonl").mkdir()  # a folder where the file should be: unreadable
    for command in (plots.main, compare_script.main):
        with pytest.raises(SystemExit):
            command([str(broken)])
        assert f"{broken / 'metrics.jsonl'}: is a directory" in one_line_error(capsys)


def test_only_a_path_s_error_is_made_one_line():
    from cory_rl.train.commands.parser import path_errors_in_one_line

    @path_errors_in_one_line
    def reads(path):
        return open(path)

    with pytest.raises(SystemExit):
        reads("/no/such/file")

    @path_errors_in_one_line
    def fails():
        raise OSError("the library's own failure")

    with pytest.raises(OSError, match="the library's own failure"):
        fails()
