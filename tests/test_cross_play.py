"""Any agent in any seat: agents of different runs, the base model and model folders play
together on the fixed held-out set; cross-play fills a pioneer x observer matrix."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest

from cory_env.checks import SettingError
from cory_rl.train.commands import evaluate as ev
from cory_rl.train.core.run_folder import load_run_config
from cory_rl.train.evaluation import evaluator
from cory_rl.train.evaluation.cross_play import BASE, Player
from cory_rl.train.training.run import run_training
from tests.conftest import tiny_config

FEW = ["--max_queries", "3", "--samples", "1"]


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("xplay")
    for seed in (0, 1):
        run_training(tiny_config(tiny_model_dir, root / f"run{seed}", iterations=2, seed=seed))
    return root / "run0", root / "run1"


def texts(answers, agent, role, model="trained"):
    keys = zip(answers["model"], answers["agent"], answers["role"], strict=True)
    rows = [i for i, key in enumerate(keys) if key == (model, agent, role)]
    return [(answers["query"][i], answers["sample"][i], answers["text"][i]) for i in rows]


def test_players_are_run_agents_the_base_model_or_folders(two_runs, tiny_model_dir):
    run = two_runs[0]
    assert Player.parse(f"{run}:llm_1") == Player(f"{run}:llm_1", run, "llm_1")
    assert Player.parse(BASE) == Player(BASE)
    assert Player.parse(tiny_model_dir).model == tiny_model_dir
    with pytest.raises(SettingError, match="name its agent"):
        Player.parse(str(run))


def test_a_run_s_agent_in_another_seat_answers_as_it_does_in_its_own_run(two_runs, tmp_path):
    """Run 0's llm_1 seated as llm_0 beside the base model gives, as pioneer, exactly the
    answers it gives as pioneer in its own run's evaluation: the same weights, sampling
    settings and random numbers (fixed per query, sample and role, not per seat)."""
    run = two_runs[0]
    [result] = ev.main(
        ["--seats", f"{{llm_0: '{run}:llm_1', llm_1: base}}", "--out", str(tmp_path / "x"), *FEW]
    )
    assert result["seats"] == {"llm_0": f"{run}:llm_1", "llm_1": BASE}
    own = evaluator.evaluate(load_run_config(run), run, samples=1, max_queries=3, reference=True)
    seated = result["answers"]
    assert texts(seated, "llm_0", "pioneer") == texts(own["answers"], "llm_1", "pioneer")
    # The base model seated as llm_1 answers as pioneer as the run's base does in seat llm_1.
    assert texts(seated, "llm_1", "pioneer") == texts(
        own["answers"], "llm_1", "pioneer", "reference"
    )
    saved = json.loads((tmp_path / "x" / "eval.json").read_text())
    assert saved["seats"] == result["seats"]


def test_cross_play_writes_a_matrix_of_every_pairing(two_runs, tmp_path, capsys):
    out = tmp_path / "matrix"
    [result] = ev.main(["--cross_play", str(two_runs[0]), "--out", str(out), *FEW])
    # Each of the 6 pairs played in a process of its own, none in this one: memory cannot
    # grow with the number of pairs.
    pids = re.findall(r"peaked at \d+ MB \(process (\d+)\)", capsys.readouterr().out)
    assert len(pids) == len(set(pids)) == 6 and str(os.getpid()) not in pids
    players = [f"{two_runs[0]}:llm_0", f"{two_runs[0]}:llm_1", BASE]
    cells = {(c["pioneer"], c["observer"]): c for c in result["cross_play"]}
    assert set(cells) == {(p, o) for p in players for o in players}
    for cell in cells.values():
        assert cell["games"] == 3
        low, high = cell["pair_ci95"]
        assert low <= cell["pair_reward"] <= high
    with (out / "cross_play.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 and (out / "cross_play.png").stat().st_size > 0


def test_bad_seats_are_refused_in_one_line(two_runs, tmp_path, capsys):
    cases = {
        "{llm_0: base, llm_2: base}": "must name the seats",
        f"{{llm_0: '{two_runs[0]}:llm_5', llm_1: base}}": "the run's agents are",
    }
    for seats, message in cases.items():
        with pytest.raises(SystemExit):
            ev.main(["--seats", seats, "--out", str(tmp_path / "y"), *FEW])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ev.main(["--seats", "{llm_0: base}", *FEW])
    assert "--out" in capsys.readouterr().err


def test_a_seated_folder_s_kl_is_measured_against_its_base(two_runs, tmp_path, tiny_model_dir):
    """An exported agent's KL is to the base it was trained from, not to itself (0): a copy of
    the base measures 0, a trained agent more; both against the run's base model."""
    import shutil

    from cory_rl.train.evaluation.cross_play import play_seats, template_config
    from cory_rl.train.publish.export import export_run

    exported = export_run(two_runs[0], tmp_path / "export")
    plain = tmp_path / "plain"  # a folder trained elsewhere: no cory_export.json
    shutil.copytree(exported["llm_0"], plain)
    (plain / "cory_export.json").unlink()
    base_copy = tmp_path / "base_copy"
    shutil.copytree(tiny_model_dir, base_copy)
    players = {"llm_0": Player.parse(str(exported["llm_1"])), "llm_1": Player.parse(str(plain))}
    template = template_config([Player(f"{two_runs[0]}:llm_0", two_runs[0], "llm_0")])
    config, answers, _ = play_seats(players, template, {"samples": 1, "max_queries": 3})
    assert config.references == {"llm_0": tiny_model_dir, "llm_1": tiny_model_dir}
    kls = [k for k in answers["kl"] if k is not None]
    assert kls and min(kls) > 0  # trained agents: above 0 against the base
    players = {"llm_0": Player.parse(str(base_copy)), "llm_1": Player.parse(str(plain))}
    config, answers, _ = play_seats(players, template, {"samples": 1, "max_queries": 3})
    by_agent = {
        a: [k for k, b in zip(answers["kl"], answers["agent"], strict=True) if b == a]
        for a in ("llm_0", "llm_1")
    }
    assert max(abs(k) for k in by_agent["llm_0"]) < 1e-6  # the base's own weights: KL 0
    assert min(by_agent["llm_1"]) > 0


def test_folders_saved_elsewhere_are_evaluated_as_a_run_of_ours(
    two_runs, tmp_path, tiny_model_dir, monkeypatch
):
    """A loop that saved plain model folders along training (the official loop's
    ``--save_every``) becomes a run folder that compare.py reads: the first folder is the
    reference (KL 0 for the base's own weights), later ones are paired with it."""
    import shutil

    from cory_rl.train.analysis.comparison import load_run
    from cory_rl.train.analysis.trajectories import trajectory
    from cory_rl.train.commands.eval_saved import evaluate_saved, main
    from cory_rl.train.publish.export import export_run

    exported = export_run(two_runs[0], tmp_path / "export")
    saved = tmp_path / "saved"
    for agent in ("llm_0", "llm_1"):
        shutil.copytree(tiny_model_dir, saved / "updates_000000" / agent)
        shutil.copytree(exported[agent], saved / "updates_000002" / agent)
        (saved / "updates_000002" / agent / "cory_export.json").unlink()  # trained elsewhere
    out = tmp_path / "official"
    few = {"samples": 1, "max_queries": 3}
    rows = evaluate_saved(saved, two_runs[0], out, seed=7, options=few)
    assert [row["eval/updates"] for row in rows] == [0, 2]
    assert abs(rows[0]["eval/all/kl"]) < 1e-6 and rows[1]["eval/all/kl"] > 0
    assert "eval/all/reward_minus_base" in rows[1]
    run = load_run(out)
    assert run.config["seed"] == 7 and run.config["algorithm"] == "cory"
    assert [t[0] for t in trajectory(run, "all")] == [0, 2]

    def no_play(*args, **kwargs):
        raise AssertionError("an evaluation already written was played again")

    monkeypatch.setattr("cory_rl.train.commands.eval_saved.play_seats", no_play)
    # as a call that played only updates 0 left the log: a call reading both back mends it
    (out / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert evaluate_saved(saved, two_runs[0], out, seed=7, options=few) == rows
    assert [t[0] for t in trajectory(load_run(out), "all")] == [0, 2]
    compact = tmp_path / "compact"
    main(
        [
            str(saved),
            "--like",
            str(two_runs[0]),
            "--seed",
            "7",
            "--out",
            str(out),
            "--results",
            str(compact),
        ]
    )
    assert (compact / "done.json").is_file() and (compact / "source.json").is_file()
    assert trajectory(load_run(compact), "all") == trajectory(run, "all")
    with pytest.raises(SettingError, match=r"no updates_<n> folder for \[3\]"):
        evaluate_saved(saved, two_runs[0], tmp_path / "x", seed=0, updates=[3])
    with pytest.raises(SettingError, match="updates_000000"):
        evaluate_saved(saved / "updates_000002", two_runs[0], tmp_path / "x", seed=0)
