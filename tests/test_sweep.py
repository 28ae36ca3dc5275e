"""Sweeps: a grid of normal run folders that a rerun continues (skip, resume, restart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cory_rl.train.commands import sweep
from cory_rl.train.training import loop as train_loop
from tests.conftest import read_jsonl


def sweep_flags(model_dir, out):
    return [
        "--algorithms",
        "ppo",
        "--setting",
        "init_kl_coef",
        "--values",
        "0.1",
        "0.2",
        "0.3",
        "--seeds",
        "0",
        "--preset",
        "smoke",
        "--out",
        str(out),
        # training flags, passed through to every run:
        "--model",
        model_dir,
        "--device",
        "cpu",
        "--batch_size",
        "4",
        "--mini_batch_size",
        "2",
        "--iterations",
        "2",
        "--checkpoint_every",
        "1",
        "--max_new_tokens",
        "[2, 5]",
        "--eval_batch_size",
        "2",
        "--eval_queries",
        "2",  # the final evaluation's set
    ]


def test_grid_names_and_order():
    points = sweep.make_grid(["ppo", "cory"], [0, 1], "lam", ["1", "-0.5"])
    assert [p.name for p in points[:4]] == [
        "ppo-lam_1-seed_0",
        "cory-lam_1-seed_0",
        "ppo-lam_-0.5-seed_0",
        "cory-lam_-0.5-seed_0",
    ]
    assert len(points) == 8 and {p.seed for p in points[4:]} == {1}
    assert [p.name for p in sweep.make_grid(["ppo"], [3], None, None)] == ["ppo-seed_3"]
    with pytest.raises(ValueError, match="go together"):
        sweep.make_grid(["ppo"], [0], "lam", None)


def test_interrupted_sweep_skips_finished_resumes_broken_restarts_empty(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "sweep"
    names = [f"ppo-init_kl_coef_{v}-seed_0" for v in ("0.1", "0.2", "0.3")]
    calls = {"n": 0}
    play_batch = train_loop.play_batch

    def crash_in_the_second_run(game, learners):
        calls["n"] += 1
        if calls["n"] == 4:  # run 1: calls 1-2; run 2: its iteration 1, after its checkpoint
            raise RuntimeError("killed")
        play_batch(game, learners)

    monkeypatch.setattr(train_loop, "play_batch", crash_in_the_second_run)
    with pytest.raises(RuntimeError, match="killed"):
        sweep.main(sweep_flags(tiny_model_dir, out))
    monkeypatch.setattr(train_loop, "play_batch", play_batch)
    record = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in record["runs"]] == ["new", "failed"]
    finished = (out / names[0] / "metrics.jsonl").read_bytes()
    # A third folder that stopped before its first checkpoint.
    (out / names[2]).mkdir()
    (out / names[2] / "metrics.jsonl").write_text('{"iteration": 0}\n')
    capsys.readouterr()
    assert sweep.main([*sweep_flags(tiny_model_dir, out), "--status"]) == []
    status = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert status == {
        names[0]: "finished (results not kept yet)",
        names[1]: "resumes from update 1 of 2",
        names[2]: "stopped before its first checkpoint (starts again)",
    }
    assert [r["iteration"] for r in read_jsonl(out / names[0] / "metrics.jsonl")] == [0, 1]

    runs = sweep.main([*sweep_flags(tiny_model_dir, out), "--evaluate"])
    assert [r["status"] for r in runs] == ["skipped", "resumed", "restarted"]
    assert all((out / name / "eval.json").is_file() for name in names)
    assert (out / names[0] / "metrics.jsonl").read_bytes() == finished
    for name, coef in zip(names, (0.1, 0.2, 0.3), strict=True):
        assert [r["iteration"] for r in read_jsonl(out / name / "metrics.jsonl")] == [0, 1]
        assert read_jsonl(out / name / "metrics.jsonl")[0]["llm_0/objective/kl_coef"] == coef
    printed = capsys.readouterr().out
    assert "finished, skipped" in printed and "resuming" in printed and "emptying" in printed

    # The same folders with another config are refused, not mixed into the sweep.
    with pytest.raises(SystemExit, match="differs in learner.learning_rate"):
        sweep.main([*sweep_flags(tiny_model_dir, out), "--learning_rate", "0.5"])


def test_committed_results_count_as_done_where_the_run_folders_are_gone(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import shutil

    from cory_rl.train.commands import compare
    from cory_rl.train.core import results

    out, kept = tmp_path / "sweep", tmp_path / "docs" / "study"
    hook = f"echo {{name}} >> {tmp_path / 'log'}"
    flags = [
        *sweep_flags(tiny_model_dir, out),
        "--eval_every",
        "1",
        "--evaluate",
        "--results",
        str(kept),
        "--on_finish",
        hook,
    ]
    runs = sweep.main(flags)
    names = [r["name"] for r in runs]
    assert [r["status"] for r in runs] == ["new"] * 3
    assert (tmp_path / "log").read_text().split() == names  # the hook ran after each run
    for name in names:
        files = {str(p.relative_to(kept / name)) for p in (kept / name).rglob("*") if p.is_file()}
        assert files == {
            "config.yaml",
            "metrics.jsonl.gz",
            "eval.json.gz",
            "done.json",
            "environment.jsonl",
            *(f"evals/updates_00000{n}.json.gz" for n in range(3)),
        }
        assert results.saved_iterations(kept / name) == 2
        compact = json.loads(results.read_text(kept / name / "eval.json"))
        assert "rows" not in compact and len(compact["answers"]["reward"]) > 0
    # Another machine: the run folders are gone, the committed results are there.
    shutil.rmtree(out)

    def no_training(*args, **kwargs):
        raise AssertionError("a committed grid point was trained again")

    monkeypatch.setattr(sweep, "run_training", no_training)
    again = sweep.main(flags)
    assert [r["status"] for r in again] == ["committed"] * 3
    capsys.readouterr()
    sweep.main([*flags, "--status"])
    assert capsys.readouterr().out.count("results kept: 2 updates; all updates") == 3
    sweep.main([*flags, "--iterations", "3", "--status"])  # results of fewer: not done
    assert capsys.readouterr().out.count("to do") == 3
    hold = sweep.hold_point(out, sweep.make_grid(["ppo"], [0], "init_kl_coef", ["0.4"])[0])
    sweep.main([*flags, "--values", "0.4", "--status"])
    assert capsys.readouterr().out.split(None, 1)[1].strip() == "running (starting)"
    hold.release()
    # Asked for more iterations than were committed, a point is not done.
    with pytest.raises(AssertionError, match="trained again"):
        sweep.main([*flags, "--iterations", "3"])
    # The results folder is what compare reads: trajectories and the final evaluation.
    written = {p.name for p in compare.compare([kept], tmp_path / "cmp", point="pioneer")}
    assert {"summary.md", "trajectory.png", "matched_kl.md"} <= written


def test_a_results_folder_git_ignores_is_refused(tmp_path, monkeypatch, capsys):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        sweep.main(["--algorithms", "ppo", "--results", "docs/runs", "--out", "x"])
    assert "git ignores that folder" in capsys.readouterr().err
    assert sweep.git_ignores(tmp_path / "docs" / "results") is False


def test_each_algorithm_takes_its_own_settings():
    """--per_algorithm: each arm at its own learning rate, one grid, one command."""
    rates = {"cory": {"learning_rate": 3e-5}, "ppo": {"learning_rate": 1e-5}}
    points = sweep.make_grid(["ppo", "cory"], [0, 1], "init_kl_coef", ["0.01"], rates)
    names = ["ppo-init_kl_coef_0.01-seed_0", "cory-init_kl_coef_0.01-seed_0"]
    assert [p.name for p in points[:2]] == names
    assert points[0].flags(Path("x"))[-2:] == ["--init_kl_coef=0.01", "--learning_rate=1e-05"]
    assert points[1].flags(Path("x"))[-1] == "--learning_rate=3e-05"
    with pytest.raises(ValueError, match="does not run"):
        sweep.make_grid(["ppo"], [0], None, None, {"grpo": {"learning_rate": 1e-5}})
    with pytest.raises(ValueError, match="the swept setting"):
        sweep.make_grid(["ppo"], [0], "learning_rate", ["1e-5"], {"ppo": {"learning_rate": 1e-5}})


def test_two_sweeps_of_one_grid_share_it(tmp_path, monkeypatch, capsys):
    """A point another sweep holds is passed over, its record in sweep.json is kept, and
    a run started by hand in a point's folder is passed over too; holds end with the sweep."""
    out = tmp_path / "sweep"
    points = sweep.make_grid(["ppo"], [0], "lam", ["1", "2", "3"])
    trained = []

    def fake_run_point(point, out_, train_flags, preset):
        if point.value == "3":
            raise sweep.RunFolderBusy(f"{out_ / point.name} is being written by a run")
        trained.append(point.name)
        return "new"

    monkeypatch.setattr(sweep, "run_point", fake_run_point)
    other = sweep.hold_point(out, points[0])  # another sweep is training the first point
    assert other is not None and sweep.hold_point(out, points[0]) is None
    sweep.write_record(out, {}, [{"name": points[0].name, "status": "new"}])

    runs = sweep.sweep(points, out, [], on_finish=f"echo {{name}} >> {tmp_path / 'log'}")

    assert [r["status"] for r in runs] == ["busy", "new", "busy"]
    assert trained == [points[1].name]
    assert (tmp_path / "log").read_text().split() == [points[1].name]  # only what it ran
    on_disk = {r["name"]: r["status"] for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert on_disk == {points[0].name: "new", points[1].name: "new", points[2].name: "busy"}
    printed = capsys.readouterr().out
    assert "another sweep is on it, passed over" in printed
    assert "another run is writing its folder" in printed and "2 point(s)" in printed
    other.release()
    for point in points:  # nothing is held once the sweep is over
        hold = sweep.hold_point(out, point)
        assert hold is not None
        hold.release()


def test_two_sweep_processes_split_a_grid(tiny_model_dir, tmp_path):
    """The same sweep command in two processes at once: every point is trained once, and
    neither sweep stops at the point the other is on."""
    out = tmp_path / "sweep"
    code = "import sys; from cory_rl.train.commands import sweep; sweep.main(sys.argv[1:])"
    command = [sys.executable, "-c", code, *sweep_flags(tiny_model_dir, out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    both = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        for _ in range(2)
    ]
    printed = [p.communicate(timeout=600)[0].decode() for p in both]
    assert [p.returncode for p in both] == [0, 0], printed
    names = [f"ppo-init_kl_coef_{v}-seed_0" for v in ("0.1", "0.2", "0.3")]
    for name in names:
        assert sum(text.count(f"sweep: {name}: training") for text in printed) == 1, printed
        assert [r["iteration"] for r in read_jsonl(out / name / "metrics.jsonl")] == [0, 1]
    record = json.loads((out / "sweep.json").read_text())
    assert sorted(r["name"] for r in record["runs"]) == sorted(names)
