"""cory-frontier: each arm's frontier over a setting, at matched KL, and collapse along
training, checked against values computed by hand."""

from __future__ import annotations

import csv
import gzip
import json

import pytest
from scipy import stats

from cory_rl.train.analysis import frontier
from cory_rl.train.commands import frontier as command
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core import results
from cory_rl.train.core.run_folder import EVAL_FORMAT
from cory_rl.train.evaluation import inference, report


def evaluation(updates, reward, kl, hit_budget=True, text="answer"):
    """One evaluation along training: 2 queries x 2 samples of the trained pioneer."""
    answers = report.empty_answers()
    for q in range(2):
        for s in range(2):
            row = {
                "model": "trained",
                "agent": "llm_0",
                "role": "pioneer",
                "query": q,
                "sample": s,
                "budget": 4,
                "reward": reward,
                "kl": kl,
                "entropy": 2.0,
                "length": 4 if hit_budget else 2,
                "hit_budget": hit_budget,
                "text": f"{text} {q} {s}",
            }
            for column, value in row.items():
                answers[column].append(value)
    rows, summary = report.summarise(answers)
    return {
        "format": EVAL_FORMAT,
        "run": "/somewhere/runs/ppo",
        "updates": updates,
        "rows": rows,
        "summary": summary,
        "answers": answers,
    }


def fake_run(path, algorithm, seed, coef, trajectory, approx_kl=0.01, iterations=20):
    """A run folder with healthy (or not) updates and evaluations (updates, KL, reward)."""
    path.mkdir(parents=True)
    overrides = {
        "seed": seed,
        "run_dir": str(path),
        "iterations": iterations,
        "learner": {"init_kl_coef": coef},
    }
    build_config("smoke", overrides=overrides, algorithm=algorithm).save(path / "config.yaml")
    rows = [
        {"iteration": i, "llm_0/ppo/approx_kl": approx_kl, "llm_0/ppo/clipfrac": 0.05}
        for i in range(iterations)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "evals").mkdir()
    for updates, kl, reward, *hit in trajectory:
        file = path / "evals" / f"updates_{updates:06d}.json"
        file.write_text(json.dumps(evaluation(updates, reward, kl, *hit)))
    return path


def test_the_best_reward_within_a_kl_reads_evaluations_and_crossings():
    rising = [(0.0, 0.1), (2.0, 0.5), (4.0, 0.4)]
    assert frontier.best_within([rising], 1.0) == pytest.approx(0.3)  # on the way to (2, 0.5)
    assert frontier.best_within([rising], 3.0) == pytest.approx(0.5)  # the evaluation at 2
    assert frontier.best_within([rising], -1.0) is None
    other = [(0.0, 0.1), (1.0, 0.45)]  # another KL coefficient of the same seed
    assert frontier.best_within([rising, other], 1.0) == pytest.approx(0.45)
    assert frontier.best_within([rising, other], 1.5) == pytest.approx(0.45)


def test_a_role_pools_every_agent_s_plays_in_it():
    """CORY's agents take turns as pioneer: the pioneer's point is both agents' plays, as
    the stopping rule and cory-compare read it, not the first agent's alone."""
    answers = report.empty_answers()
    plays = {  # (agent, role): (reward, KL, hit the budget)
        ("llm_0", "pioneer"): (0.2, 1.0, True),
        ("llm_0", "observer"): (0.9, 5.0, True),
        ("llm_1", "pioneer"): (0.4, 3.0, False),
        ("llm_1", "observer"): (0.7, 7.0, True),
    }
    for (agent, role), (reward, kl, hit) in plays.items():
        for q in range(2):
            row = {
                "model": "trained", "agent": agent, "role": role, "query": q, "sample": 0,
                "budget": 4, "reward": reward, "kl": kl, "entropy": 2.0,
                "length": 4 if hit else 2, "hit_budget": hit, "text": f"{agent} {role} {q}",
            }  # fmt: skip
            for column, value in row.items():
                answers[column].append(value)
    evaluation = {"updates": 10, "answers": answers}
    pioneer = frontier.eval_point(evaluation, "pioneer")
    assert (pioneer["reward"], pioneer["kl"]) == (pytest.approx(0.3), pytest.approx(2.0))
    assert (pioneer["eos_rate"], pioneer["length"]) == (0.5, 3.0)
    everything = frontier.eval_point(evaluation, "all")
    assert (everything["reward"], everything["kl"]) == (pytest.approx(0.55), pytest.approx(4.0))
    agent = frontier.eval_point(evaluation, "llm_1")  # an agent: its plays in both roles
    assert (agent["reward"], agent["kl"]) == (pytest.approx(0.55), pytest.approx(5.0))
    one = frontier.eval_point(evaluation, "llm_1/pioneer")  # one policy in one role
    assert (one["reward"], one["kl"], one["eos_rate"]) == (pytest.approx(0.4), 3.0, 1.0)
    assert frontier.eval_point(evaluation, "llm_2") is None
    assert frontier.eval_point(evaluation, "llm_0/referee") is None


def make_study(root):
    """Two arms x two seeds x two KL coefficients, and one PPO run outside the band."""
    runs = root / "results"
    ppo = {
        (0, 0.01): [(0, 0.0, 0.1), (10, 2.0, 0.5), (20, 4.0, 0.6)],
        (0, 0.1): [(0, 0.0, 0.1), (10, 1.0, 0.3), (20, 2.0, 0.4)],
        (1, 0.01): [(0, 0.0, 0.1), (10, 2.0, 0.3), (20, 4.0, 0.5)],
        (1, 0.1): [(0, 0.0, 0.1), (10, 1.0, 0.2), (20, 2.0, 0.35)],
    }
    cory = {
        (0, 0.01): [(0, 0.0, 0.1), (10, 2.0, 0.7), (20, 5.0, 0.8, False)],
        (0, 0.1): [(0, 0.0, 0.1), (10, 1.0, 0.4), (20, 2.0, 0.6)],
        (1, 0.01): [(0, 0.0, 0.1), (10, 2.0, 0.6), (20, 5.0, 0.7, False)],
        (1, 0.1): [(0, 0.0, 0.1), (10, 1.0, 0.5), (20, 2.0, 0.55)],
    }
    for name, arm in (("ppo", ppo), ("cory", cory)):
        for (seed, coef), trajectory in arm.items():
            fake_run(runs / f"{name}-{coef}-{seed}", name, seed, coef, trajectory)
    fake_run(runs / "ppo-0.001-0", "ppo", 0, 0.001, [(0, 0.0, 0.1), (10, 3.0, 0.9)], approx_kl=0.2)
    return runs


def test_matched_kl_compares_each_seed_s_frontier_with_welch_and_holm(tmp_path):
    arms = [frontier.read_arm(p, "init_kl_coef", "pioneer") for p in make_study(tmp_path).iterdir()]
    # every counted seed reaches KL 4 (PPO) or 5 (CORY); the unhealthy PPO run is left out
    assert frontier.frontier_kls(arms, count=2) == [2.0, 4.0]
    rows = {(r["kl"], r["algorithm"]): r for r in frontier.matched_rows(arms, [1.0, 2.0], "ppo")}
    # KL 1: PPO seed 0 best of (0.1 + 0.4/2 = 0.3, 0.3) = 0.3; seed 1 best of (0.2, 0.2) = 0.2
    assert rows[1.0, "ppo"]["reward"] == pytest.approx(0.25)
    # CORY seed 0: max(0.1 + 0.6/2, 0.4) = 0.4; seed 1: max(0.35, 0.5) = 0.5
    assert rows[1.0, "cory"]["reward"] == pytest.approx(0.45)
    # KL 2: PPO (0.5, 0.35), CORY (0.7, 0.6)
    welch = stats.ttest_ind([0.7, 0.6], [0.5, 0.35], equal_var=False)
    assert rows[2.0, "cory"]["diff"] == pytest.approx(0.65 - 0.425)
    assert rows[2.0, "cory"]["welch_p"] == pytest.approx(welch.pvalue)
    holm = inference.holm([rows[1.0, "cory"]["welch_p"], rows[2.0, "cory"]["welch_p"]])
    assert [rows[1.0, "cory"]["welch_p_holm"], rows[2.0, "cory"]["welch_p_holm"]] == holm
    assert rows[2.0, "ppo"]["diff"] is None
    interval = inference.t_interval([0.7, 0.6])["ci"]
    assert [rows[2.0, "cory"]["reward_ci_low"], rows[2.0, "cory"]["reward_ci_high"]] == interval


def test_an_unhealthy_run_is_listed_and_not_counted(tmp_path):
    arms = [frontier.read_arm(p, "init_kl_coef", "pioneer") for p in make_study(tmp_path).iterdir()]
    rows = {(r["algorithm"], r["value"]): r for r in frontier.run_rows(arms)}
    low = rows["ppo", 0.001]
    assert (low["counted"], low["seeds"], low["kl"]) == (0, 1, None)
    assert "(not counted)" in low["health"]
    assert "unfinished (10 of 20 updates evaluated)" in low["stopped"]
    high = rows["ppo", 0.1]
    assert high["kl"] == pytest.approx(2.0)
    assert high["reward"] == pytest.approx((0.4 + 0.35) / 2)
    assert "all 20 updates" in high["stopped"]


def test_the_knob_table_says_per_seed_whether_the_kl_falls_with_the_coefficient(tmp_path):
    runs = make_study(tmp_path)
    arms = [frontier.read_arm(p, "init_kl_coef", "pioneer") for p in runs.iterdir()]
    rows = {(r["algorithm"], r["seed"]): r for r in frontier.knob_rows(arms)}
    # PPO seed 0: the unhealthy 0.001 run stopped at 10 updates, so all three read at 10
    first = rows["ppo", 0]
    assert (first["updates"], first["values"], first["kls"]) == (
        10,
        [0.001, 0.01, 0.1],
        [3.0, 2.0, 1.0],
    )
    assert (first["falls"], first["healthy"]) == (True, False)
    assert (rows["ppo", 1]["updates"], rows["ppo", 1]["kls"]) == (20, [4.0, 2.0])
    assert rows["cory", 0]["falls"] and rows["cory", 1]["falls"]
    fake_run(runs / "cory-1.0-1", "cory", 1, 1.0, [(0, 0.0, 0.1), (10, 1.5, 0.1), (20, 2.0, 0.1)])
    command.main([str(runs), "--setting", "init_kl_coef"])
    table = (tmp_path / "frontier" / "frontier_knob.md").read_text()
    assert "- cory: falls in 1 of 2 seeds" in table and "- ppo: falls in 2 of 2 seeds" in table
    assert "| cory | 1 | 20 | 0.01: 5.000, 0.1: 2.000, 1: 2.000 | **no** | yes |" in table
    with (tmp_path / "frontier" / "frontier_knob.csv").open() as f:
        first_row = next(csv.DictReader(f))
    assert set(first_row) >= {"kl_at_0.001", "kl_at_1", "falls", "healthy"}


def test_collapse_along_training_gives_the_eos_rate_and_length(tmp_path):
    arms = [frontier.read_arm(p, "init_kl_coef", "pioneer") for p in make_study(tmp_path).iterdir()]
    rows = {(r["algorithm"], r["value"], r["updates"]): r for r in frontier.collapse_rows(arms)}
    end = rows["cory", 0.01, 20]  # every answer hit no budget: ended by EOS, 2 tokens
    assert (end["eos_rate"], end["length"], end["seeds"]) == (1.0, 2.0, 2)
    assert rows["cory", 0.01, 10]["eos_rate"] == 0.0
    assert rows["ppo", 0.001, 10]["reward"] == pytest.approx(0.9)  # every run, counted or not


def test_the_command_writes_the_tables_and_figure(tmp_path, capsys):
    runs = make_study(tmp_path)
    written = command.main([str(runs), "--setting", "init_kl_coef", "--at_kl", "1", "2"])
    names = {p.name for p in written}
    assert {
        "frontier_runs.md",
        "frontier_matched.csv",
        "collapse_along.md",
        "frontier.png",
    } <= names
    assert all(p.parent == tmp_path / "frontier" for p in written)
    with (tmp_path / "frontier" / "frontier_matched.csv").open() as f:
        kls = [float(r["kl"]) for r in csv.DictReader(f)]
    assert kls == [1.0, 1.0, 2.0, 2.0]
    low, high = inference.t_interval([0.7, 0.6])["ci"]  # CORY's seeds at KL 2
    table = (tmp_path / "frontier" / "frontier_matched.md").read_text()
    assert f"| 2 | cory | 2 | 0.650 ± 0.071 | [{low:.3f}, {high:.3f}] | +0.225 |" in table


def test_bad_input_is_refused_in_one_line(tmp_path, capsys):
    runs = make_study(tmp_path)
    with pytest.raises(SystemExit):
        command.main([str(runs), "--setting", "init_kl_coef", "--baseline", "grpo"])
    assert "'grpo' is not an arm here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main([str(runs), "--setting", "no_such_setting"])
    assert "'no_such_setting' is neither a learner setting" in capsys.readouterr().err
    bare = fake_run(tmp_path / "bare" / "run", "ppo", 0, 0.1, [])
    with pytest.raises(SystemExit):
        command.main([str(bare), "--setting", "init_kl_coef"])
    assert "no evaluation along training" in capsys.readouterr().err


def test_the_baseline_arm_can_be_read_at_another_point(tmp_path, capsys):
    """--baseline_point: PPO's pioneer against one of CORY's agents as pioneer."""
    runs = make_study(tmp_path)
    default = command.main([str(runs), "--setting", "init_kl_coef", "--out", str(tmp_path / "a")])
    named = command.main(
        [str(runs), "--setting", "init_kl_coef", "--out", str(tmp_path / "b"), "--point",
         "llm_0/pioneer", "--baseline_point", "pioneer"]
    )  # fmt: skip
    for a, b in zip(default, named, strict=True):
        if a.suffix == ".md":
            assert a.read_text() == b.read_text()
    with pytest.raises(SystemExit):  # only the baseline (PPO) is read at the other point
        command.main([str(runs), "--setting", "init_kl_coef", "--baseline_point", "observer"])
    assert "ppo-" in capsys.readouterr().err.split("no evaluation along training")[0]


def test_compact_results_give_the_same_numbers_and_name_their_run(tmp_path):
    run = fake_run(tmp_path / "runs" / "ppo-0.1-0", "ppo", 0, 0.1, [(0, 0.0, 0.1), (10, 1.5, 0.3)])
    saved = results.save_results(run, tmp_path / "results" / run.name)
    assert frontier.read_arm(saved, "init_kl_coef", "pioneer").evaluations == (
        frontier.read_arm(run, "init_kl_coef", "pioneer").evaluations
    )
    # committed results say which run, not where it lived
    assert json.loads((saved / "done.json").read_text())["run"] == "ppo-0.1-0"
    assert "run_dir: ppo-0.1-0\n" in (saved / "config.yaml").read_text()
    compact = json.loads(gzip.decompress((saved / "evals" / "updates_000010.json.gz").read_bytes()))
    assert "rows" not in compact and compact["run"] == "ppo"


def test_a_kl_outside_what_every_seed_reached_is_said_and_zero_is_refused(tmp_path, capsys):
    runs = make_study(tmp_path)
    command.main([str(runs), "--setting", "init_kl_coef", "--at_kl", "2", "9"])
    said = capsys.readouterr().out
    assert "--at_kl 2 is outside" not in said
    assert "frontier: --at_kl 9 is outside the KLs every counted seed reached (0 to 4)" in said
    with pytest.raises(SystemExit):
        command.main([str(runs), "--setting", "init_kl_coef", "--at_kl", "0", "2"])
    assert "argument --at_kl: 0 is not a number above 0" in capsys.readouterr().err
