"""compare.py: runs grouped by everything but the seed, curves with their spread, frontier."""

from __future__ import annotations

import csv
import json
import math

import pytest
from scipy import stats

from cory_rl.train.analysis import comparison
from cory_rl.train.commands import compare
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.run_folder import EVAL_FORMAT
from cory_rl.train.evaluation import report

QUERY_OFFSETS = (-0.1, 0.0, 0.1, 0.0)
"""Per-query offsets of a fake evaluation's rewards (mean 0): 4 queries x 2 samples."""


def fake_answers(model, reward, kl, offsets=QUERY_OFFSETS):
    answers = report.empty_answers()
    for q, offset in enumerate(offsets):
        for s in range(2):
            row = {
                "model": model,
                "agent": "llm_0",
                "role": "pioneer",
                "query": q,
                "sample": s,
                "budget": 4,
                "reward": reward + offset,
                "kl": kl,
                "entropy": 1.0,
                "length": 4,
                "hit_budget": True,
                "text": f"answer {q} {s} {model}",
            }
            for column, value in row.items():
                answers[column].append(value)
    return answers


def fake_evaluation(reward, kl, offsets=QUERY_OFFSETS):
    """An eval.json (format 2) whose trained rewards are ``reward`` + offsets, base 0.1."""
    answers = report.concat(
        fake_answers("reference", 0.1, 0.0, offsets), fake_answers("trained", reward, kl, offsets)
    )
    rows, summary = report.summarise(answers)
    eval_set = {"seed": 1234, "samples": 2, "queries": ["a", "b", "c", "d"]}
    return {
        "format": EVAL_FORMAT,
        "eval_set": eval_set,
        "rows": rows,
        "summary": summary,
        "answers": answers,
    }


def fake_run(path, algorithm, seed, kl_coef, scores, kl, evaluation=None, trajectory=()):
    """A run folder as training and evaluation leave it, without training anything.

    ``trajectory``: (updates, held-out KL, held-out reward) rows of evaluations along it."""
    path.mkdir(parents=True)
    overrides = {"seed": seed, "run_dir": str(path), "learner": {"init_kl_coef": kl_coef}}
    build_config("smoke", overrides=overrides, algorithm=algorithm).save(path / "config.yaml")
    rows = []
    for it, score in enumerate(scores):
        row = {"iteration": it}
        for prefix in ("llm_0", "pioneer"):
            row.update(
                {
                    f"{prefix}/score": score,
                    f"{prefix}/kl": kl * it,
                    f"{prefix}/objective": score - 0.01 * kl * it,
                }
            )
        rows.append(row)
    for updates, test_kl, reward in trajectory:
        rows.append(
            {
                "iteration": updates - 1,
                "eval/updates": updates,
                "eval/pioneer/kl": test_kl,
                "eval/pioneer/reward": reward,
                "eval/pioneer/entropy": 4.0 - reward,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evaluation is not None:
        (path / "eval.json").write_text(json.dumps(fake_evaluation(*evaluation)))
    return path


def test_runs_group_by_everything_but_the_seed(tmp_path):
    paths = [
        fake_run(tmp_path / "a0", "ppo", 0, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "b0", "ppo", 0, 0.2, [0.0], 1.0),
        fake_run(tmp_path / "a1", "ppo", 1, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "c0", "cory", 0, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "a2", "ppo", 2, 0.1, [0.0], 1.0),
    ]
    groups = comparison.group_runs([comparison.load_run(p) for p in paths])
    assert [(g.label, [r.path.name for r in g.runs]) for g in groups] == [
        ("ppo init_kl_coef=0.1", ["a0", "a1", "a2"]),
        ("ppo init_kl_coef=0.2", ["b0"]),
        ("cory", ["c0"]),  # nothing varies between cory groups: the algorithm alone
    ]
    # A sweep folder stands for the run folders inside it.
    assert comparison.run_folders([tmp_path]) == sorted(paths)


def test_a_config_written_another_way_groups_with_the_same_settings(tmp_path):
    """A config with flat game settings (``lam: 1.0``), a default left out and a number of
    another type (``lora_alpha: 32.0``) groups with the same settings saved in full."""
    import yaml

    saved = fake_run(tmp_path / "saved", "cory", 0, 0.1, [0.0], 1.0)
    written = fake_run(tmp_path / "written", "cory", 1, 0.1, [0.0], 1.0)
    values = yaml.safe_load((written / "config.yaml").read_text())
    values.update(values.pop("game"))
    del values["rollout_engine"]  # left out: the default
    values["lora_alpha"] = float(values["lora_alpha"])  # 32.0 reads as the int 32
    (written / "config.yaml").write_text(yaml.safe_dump(values))
    groups = comparison.group_runs([comparison.load_run(p) for p in (saved, written)])
    assert [(g.label, len(g.runs)) for g in groups] == [("cory", 2)]


def test_curves_and_frontier_files(tmp_path, capsys):
    runs = tmp_path / "sweep"
    fake_run(runs / "p1", "ppo", 0, 0.1, [0.0, 0.2, 0.4], 1.0, evaluation=(0.5, 4.0))
    fake_run(runs / "p2", "ppo", 1, 0.1, [0.2, 0.4, 0.8], 3.0, evaluation=(0.7, 6.0))
    fake_run(runs / "p3", "ppo", 0, 0.2, [0.0, 0.1, 0.2], 1.0, evaluation=(0.4, 5.0))
    fake_run(runs / "c1", "cory", 0, 0.1, [0.1, 0.3, 0.5], 0.5, evaluation=(0.6, 2.0))
    written = compare.main([str(runs), "--out", str(tmp_path / "out")])
    names = {p.name for p in written}
    assert names == {
        "curves-agents.png",
        "curves-agents.csv",
        "curves-roles.png",
        "curves-roles.csv",
        "frontier.png",
        "frontier.csv",
        "summary.csv",
        "summary.md",
        "comparisons.csv",
        "comparisons.md",
    }
    with (tmp_path / "out" / "curves-agents.csv").open() as f:
        table = list(csv.DictReader(f))
    two_seeds = [
        r
        for r in table
        if r["group"] == "ppo init_kl_coef=0.1"
        and r["quantity"] == "score"
        and r["iteration"] == "2"
    ]
    (row,) = two_seeds
    assert float(row["mean"]) == pytest.approx(0.6) and row["seeds"] == "2"
    assert float(row["min"]) == 0.4 and float(row["max"]) == 0.8
    assert float(row["std"]) == pytest.approx(0.2828427, rel=1e-6)  # sample std of 0.4, 0.8
    roles = list(csv.DictReader((tmp_path / "out" / "curves-roles.csv").open()))
    assert {r["curve"] for r in roles} == {"pioneer"}
    with (tmp_path / "out" / "frontier.csv").open() as f:
        frontier = {r["run"].rsplit("/", 1)[-1]: r for r in csv.DictReader(f)}
    # ppo: (4, .5) and (6, .7) are non-dominated, (5, .4) is dominated by (4, .5).
    assert {k: v["on_front"] for k, v in frontier.items()} == {
        "p1": "True",
        "p2": "True",
        "p3": "False",
        "c1": "True",
    }
    assert float(frontier["c1"]["r - 0.01 KL"]) == pytest.approx(0.6 - 0.02)
    printed = capsys.readouterr().out
    assert "ppo init_kl_coef=0.1: 2 seed(s)" in printed
    summary = {r["group"]: r for r in csv.DictReader((tmp_path / "out" / "summary.csv").open())}
    two = summary["ppo init_kl_coef=0.1"]  # rewards 0.5 and 0.7 beside a base of 0.1
    assert two["seeds"] == "2" and two["answers_per_seed"] == "8"
    assert float(two["reward_mean"]) == pytest.approx(0.6)
    assert float(two["reward_std"]) == pytest.approx(0.1414214, rel=1e-6)
    # t_{1, 0.975} = 12.7062047: 0.6 -+ 12.7062047 * 0.1414214 / sqrt(2) = 0.6 -+ 1.2706205
    assert float(two["reward_ci_low"]) == pytest.approx(0.6 - 1.2706205, rel=1e-6)
    assert float(two["reward_minus_base_mean"]) == pytest.approx(0.5)
    assert float(two["kl_mean"]) == pytest.approx(5.0)
    assert summary["cory"]["reward_std"] == "" and summary["cory"]["reward_ci_low"] == ""
    assert "| ppo init_kl_coef=0.1 | 2 | 8 | 0.600 ± 0.141 | [-0.671, 1.871] |" in printed
    assert "| cory | 1 | 8 | 0.600 ± n/a | n/a |" in printed


def test_each_comparison_carries_a_welch_test_and_a_query_bootstrap(tmp_path):
    runs = tmp_path / "sweep"
    for seed, reward in enumerate((0.5, 0.6, 0.7)):
        fake_run(runs / f"p{seed}", "ppo", seed, 0.1, [0.0], 1.0, evaluation=(reward, 4.0))
    for seed, reward in enumerate((0.8, 0.9)):
        fake_run(runs / f"c{seed}", "cory", seed, 0.1, [0.0], 1.0, evaluation=(reward, 4.0))
    compare.main([str(runs), "--out", str(tmp_path / "out"), "--baseline", "ppo"])
    (row,) = list(csv.DictReader((tmp_path / "out" / "comparisons.csv").open()))
    assert (row["group"], row["baseline"]) == ("cory", "ppo")
    # cory 0.85 (var 0.005, n 2) - ppo 0.6 (var 0.01, n 3): se^2 = 0.0025 + 0.01/3
    se = math.sqrt(0.0025 + 0.01 / 3)
    df = se**4 / (0.0025**2 / 1 + (0.01 / 3) ** 2 / 2)
    assert float(row["diff"]) == pytest.approx(0.25)
    assert float(row["welch_df"]) == pytest.approx(df)
    assert float(row["welch_p"]) == pytest.approx(2 * stats.t.sf(0.25 / se, df))
    # Per query both groups carry the same offsets: every query differs by exactly 0.25.
    assert float(row["query_diff"]) == pytest.approx(0.25) and row["queries"] == "4"
    assert float(row["query_ci_low"]) == pytest.approx(0.25)
    assert float(row["query_ci_high"]) == pytest.approx(0.25)


def test_groups_on_different_evaluation_sets_get_no_query_bootstrap(tmp_path):
    runs = tmp_path / "sweep"
    fake_run(runs / "p0", "ppo", 0, 0.1, [0.0], 1.0, evaluation=(0.5, 4.0))
    other = fake_run(runs / "c0", "cory", 0, 0.1, [0.0], 1.0, evaluation=(0.8, 4.0))
    evaluation = json.loads((other / "eval.json").read_text())
    evaluation["eval_set"]["seed"] = 99
    (other / "eval.json").write_text(json.dumps(evaluation))
    compare.main([str(runs), "--out", str(tmp_path / "out")])
    (row,) = list(csv.DictReader((tmp_path / "out" / "comparisons.csv").open()))
    assert row["query_diff"] == "" and row["welch_p"] == ""  # and one seed each: no Welch


def test_matched_kl_reads_each_seed_s_trajectory(tmp_path):
    runs = tmp_path / "sweep"
    fake_run(
        runs / "p0",
        "ppo",
        0,
        0.1,
        [0.0],
        1.0,
        trajectory=[(0, 0.0, 0.1), (10, 4.0, 0.5), (20, 12.0, 0.9)],
    )
    fake_run(
        runs / "p1",
        "ppo",
        1,
        0.1,
        [0.0],
        1.0,
        trajectory=[(0, 0.0, 0.1), (10, 2.0, 0.3), (20, 10.0, 0.7)],
    )
    fake_run(
        runs / "c0",
        "cory",
        0,
        0.1,
        [0.0],
        1.0,
        trajectory=[(0, 0.0, 0.1), (10, 8.0, 0.9), (20, 11.0, 1.0)],
    )
    out = ["--out", str(tmp_path / "out"), "--baseline", "ppo", "--at_kl", "2", "10"]
    written = compare.main([str(runs), *out])
    assert {"trajectory.png", "objective.png", "trajectory.csv", "matched_kl.md"} <= {
        p.name for p in written
    }
    rows = {
        (r["group"], r["kl"]): r
        for r in csv.DictReader((tmp_path / "out" / "matched_kl.csv").open())
    }
    # ppo at KL 2: seed 0 halfway to 4 -> 0.3; seed 1 exactly 0.3. At 10: 0.8 and 0.7.
    assert float(rows["ppo", "2.0"]["reward"]) == pytest.approx(0.3)
    assert float(rows["ppo", "10.0"]["reward"]) == pytest.approx(0.75)
    assert float(rows["ppo", "10.0"]["std"]) == pytest.approx(math.sqrt(0.005))
    # cory: 0.1 + 0.8 * 2 / 8 = 0.3 at KL 2; 0.9 + 0.1 * 2 / 3 at KL 10; one seed: no test
    assert float(rows["cory", "10.0"]["reward"]) == pytest.approx(0.9 + 0.2 / 3)
    assert float(rows["cory", "10.0"]["diff"]) == pytest.approx(0.9 + 0.2 / 3 - 0.75)
    assert rows["cory", "10.0"]["welch_p"] == "" and rows["cory", "10.0"]["std"] == ""
    assert rows["cory", "10.0"]["welch_p_holm"] == "" and rows["cory", "10.0"]["hedges_g"] == ""
    # Collapse indicators at the same KL (here entropy = 4 - reward), mean over seeds.
    assert float(rows["ppo", "10.0"]["entropy"]) == pytest.approx(4 - 0.75)
    assert rows["ppo", "10.0"]["repetitive"] == ""  # not logged by these fake runs
    # By default: KLs up to the largest every seed reaches (10, the smallest maximum).
    compare.main([str(runs), "--out", str(tmp_path / "auto")])
    kls = {r["kl"] for r in csv.DictReader((tmp_path / "auto" / "matched_kl.csv").open())}
    assert kls == {"2.5", "5.0", "7.5", "10.0"}


def test_collapse_indicators_at_matched_kl_carry_a_welch_test(tmp_path):
    runs = tmp_path / "sweep"
    for name, algorithm, seed, rewards in [
        ("p0", "ppo", 0, (0.5, 0.9)),
        ("p1", "ppo", 1, (0.3, 0.7)),
        ("c0", "cory", 0, (0.2, 0.4)),
        ("c1", "cory", 1, (0.3, 0.6)),
    ]:
        trajectory = [(0, 0.0, 0.1), (10, 4.0, rewards[0]), (20, 12.0, rewards[1])]
        fake_run(runs / name, algorithm, seed, 0.1, [0.0], 1.0, trajectory=trajectory)
    compare.main([str(runs), "--out", str(tmp_path / "out"), "--baseline", "ppo", "--at_kl", "4"])
    rows = {r["group"]: r for r in csv.DictReader((tmp_path / "out" / "matched_kl.csv").open())}
    # Entropy is 4 - reward in these runs: ppo 3.5 and 3.7, cory 3.8 and 3.7 at KL 4.
    expected = stats.ttest_ind([3.8, 3.7], [3.5, 3.7], equal_var=False).pvalue
    assert float(rows["cory"]["entropy_p"]) == pytest.approx(expected)
    assert float(rows["cory"]["entropy"]) == pytest.approx(3.75)
    assert rows["ppo"]["entropy_p"] == ""  # the baseline is not tested against itself
    assert rows["cory"]["repetitive_p"] == ""  # not logged by these fake runs: no test
    assert f"3.75 ({float(expected):.3f})" in (tmp_path / "out" / "matched_kl.md").read_text()


def test_matched_kl_p_values_are_holm_adjusted_over_the_kls(tmp_path):
    runs = tmp_path / "sweep"
    for name, algorithm, seed, rewards in [
        ("p0", "ppo", 0, (0.5, 0.9)),
        ("p1", "ppo", 1, (0.3, 0.7)),
        ("c0", "cory", 0, (0.2, 0.4)),
        ("c1", "cory", 1, (0.3, 0.6)),
    ]:
        trajectory = [(0, 0.0, 0.1), (10, 4.0, rewards[0]), (20, 12.0, rewards[1])]
        fake_run(runs / name, algorithm, seed, 0.1, [0.0], 1.0, trajectory=trajectory)
    out = tmp_path / "out"
    compare.main([str(runs), "--out", str(out), "--baseline", "ppo", "--at_kl", "4", "12"])
    rows = {
        r["kl"]: r for r in csv.DictReader((out / "matched_kl.csv").open()) if r["group"] == "cory"
    }
    p4 = stats.ttest_ind([0.2, 0.3], [0.5, 0.3], equal_var=False).pvalue
    p12 = stats.ttest_ind([0.4, 0.6], [0.9, 0.7], equal_var=False).pvalue
    low, high = sorted([p4, p12])
    adjusted = {p4: None, p12: None}
    adjusted[low], adjusted[high] = min(1, 2 * low), max(min(1, 2 * low), high)
    assert float(rows["4.0"]["welch_p_holm"]) == pytest.approx(adjusted[p4])
    assert float(rows["12.0"]["welch_p_holm"]) == pytest.approx(adjusted[p12])
    # Hedges' g at KL 12: (0.5 - 0.8) / pooled std sqrt(0.02), times 1 - 3/7.
    assert float(rows["12.0"]["hedges_g"]) == pytest.approx((1 - 3 / 7) * -0.3 / math.sqrt(0.02))
    assert "p (Holm)" in (out / "matched_kl.md").read_text()


def test_an_evaluation_of_another_format_is_refused_naming_the_file(tmp_path):
    run = fake_run(tmp_path / "p0", "ppo", 0, 0.1, [0.0], 1.0)
    (run / "eval.json").write_text(json.dumps({"summary": {}}))
    with pytest.raises(ValueError, match=r"eval\.json: an evaluation of format None, not 2"):
        comparison.load_run(run)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--at_kl", "-5"], "argument --at_kl: -5 is not a number above 0"),
        (["--at_kl", "0"], "argument --at_kl: 0 is not a number above 0"),
        (["--at_kl", "0", "0.5"], "argument --at_kl: 0 is not a number above 0"),
        (["--at_kl", "nan"], "argument --at_kl: nan is not a number above 0"),
        (["--eta", "-1"], "argument --eta: -1 is not a number at least 0"),
    ],
)
def test_a_meaningless_number_is_refused_in_one_line(tmp_path, capsys, flags, message):
    fake_run(tmp_path / "p0", "ppo", 0, 0.1, [0.0], 1.0)
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path), "--out", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[0] and len(err) == 2
    assert not (tmp_path / "out").exists()


def test_a_kl_outside_what_every_seed_reaches_is_said(tmp_path, capsys):
    runs = tmp_path / "sweep"
    for name, algorithm, seed, top in [("p0", "ppo", 0, 12.0), ("c0", "cory", 0, 10.0)]:
        trajectory = [(0, 0.0, 0.1), (10, top / 2, 0.5), (20, top, 0.9)]
        fake_run(runs / name, algorithm, seed, 0.1, [0.0], 1.0, trajectory=trajectory)
    out = ["--out", str(tmp_path / "out"), "--baseline", "ppo"]
    compare.main([str(runs), *out, "--at_kl", "5", "11", "50"])
    said = capsys.readouterr().out
    assert "--at_kl 5 is outside" not in said
    assert "--at_kl 11 is outside the held-out KLs every seed reaches (0 to 10" in said
    assert "11 is outside" in said and "its rows count only the seeds that reach it" in said
    assert "--at_kl 50 is outside" in said and "no seed reaches it: it has no row" in said
    kls = {r["kl"] for r in csv.DictReader((tmp_path / "out" / "matched_kl.csv").open())}
    assert kls == {"5.0", "11.0"}
    compare.main([str(runs), *out, "--at_kl", "50"])
    assert "no seed reaches any of --at_kl 50: no matched-KL table" in capsys.readouterr().out


def test_a_point_no_evaluation_reports_is_refused_before_anything_is_written(tmp_path, capsys):
    fake_run(tmp_path / "p0", "ppo", 0, 0.1, [0.0], 1.0, trajectory=[(10, 1.0, 0.5)])
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path), "--out", str(tmp_path / "out"), "--point", "nobody"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "--point 'nobody' is not in these runs' evaluations; choose one of" in err[0]
    assert "'pioneer'" in err[0] and not (tmp_path / "out").exists()


def test_an_answer_checked_task_gets_pass_at_k_along_training(tmp_path):
    """Each evaluation along training's pass@k, per seed and mean ± std over seeds; a task
    that is not answer-checked gets no such table."""
    for seed, right_1 in ((0, 1), (1, 2)):  # samples that answer query 1 right, of 2
        run = fake_run(tmp_path / f"ppo-{seed}", "ppo", seed, 0.1, [0.1, 0.2], 0.1)
        (run / "evals").mkdir()
        for updates, model in ((0, "reference"), (10, "trained")):
            answers = fake_answers(model, 0.0, 0.5 * updates)
            # after training query 0 is answered right by every sample, query 1 by right_1
            pairs = zip(answers["query"], answers["sample"], strict=True)
            answers["reward"] = [
                float(updates > 0 and (q == 0 or (q == 1 and s < right_1))) for q, s in pairs
            ]
            _, summary = report.summarise(answers, checked=True)
            (run / "evals" / f"updates_{updates:06d}.json").write_text(
                json.dumps({"format": EVAL_FORMAT, "updates": updates, "summary": summary})
            )
    # a group whose evaluations reach a larger k (4 answers per query) than the other's
    cory = fake_run(tmp_path / "cory-0", "cory", 0, 0.1, [0.1, 0.2], 0.1)
    (cory / "evals").mkdir()
    flat = (0.0,) * 4
    answers = report.concat(
        fake_answers("trained", 1.0, 1.0, flat), fake_answers("trained", 0.0, 1.0, flat)
    )
    answers["sample"] = [s + 2 * (i >= 8) for i, s in enumerate(answers["sample"])]
    _, summary = report.summarise(answers, checked=True)  # each query: 2 of 4 right
    (cory / "evals" / "updates_000010.json").write_text(
        json.dumps({"format": EVAL_FORMAT, "updates": 10, "summary": summary})
    )
    out = tmp_path / "out"
    compare.compare([tmp_path], out, baseline="ppo")
    assert "| cory | 10 | 1 | 1.000 | 0.500 | 0.833 | 1.000 |" in (out / "pass_at_k.md").read_text()
    rows = [r for r in csv.DictReader((out / "pass_at_k.csv").open()) if r["group"] == "ppo"]
    trained = {r["seed"]: r for r in rows if r["updates"] == "10"}
    # seed 0: queries 0 (2 of 2) and 1 (1 of 2) of 4 -> pass@1 (1 + 0.5) / 4, pass@2 2 / 4
    assert float(trained["0"]["pass@1"]) == pytest.approx(0.375)
    assert float(trained["0"]["pass@2"]) == pytest.approx(0.5)
    assert float(trained["1"]["pass@1"]) == pytest.approx(0.5)
    assert float(trained["0"]["kl"]) == pytest.approx(5.0)
    table = (out / "pass_at_k.md").read_text()
    assert "| ppo | 10 | 2 | 5.000 ± 0.000 | 0.438 ± 0.088 | 0.500 ± 0.000 |  |" in table
    other = tmp_path / "other"
    fake_run(other / "ppo-0", "ppo", 0, 0.1, [0.1], 0.1, evaluation=(0.3, 1.0))
    compare.compare([other], tmp_path / "out2")
    assert not (tmp_path / "out2" / "pass_at_k.md").exists()


def test_a_two_agent_checked_game_gets_the_observer_s_reference_use_along_training(tmp_path):
    """The observer's pass@1 after a right and after a wrong pioneer answer, per seed and
    mean ± std over seeds; a game without an observer gets no such table."""
    for seed, observer_right in ((0, (1.0, 0.0)), (1, (1.0, 1.0))):
        run = fake_run(tmp_path / f"cory-{seed}", "cory", seed, 0.1, [0.1], 0.1)
        (run / "evals").mkdir()
        pioneer = fake_answers("trained", 0.0, 1.0, (0.0,) * 2)  # 2 queries x 2 samples
        pioneer["reward"] = [float(q == 0) for q in pioneer["query"]]  # right on query 0
        observer = fake_answers("trained", 0.0, 1.0, (0.0,) * 2)
        observer["agent"], observer["role"] = ["llm_1"] * 4, ["observer"] * 4
        # after the right answer (query 0) and after the wrong one (query 1)
        observer["reward"] = [observer_right[q] for q in observer["query"]]
        _, summary = report.summarise(report.concat(pioneer, observer), checked=True)
        (run / "evals" / "updates_000010.json").write_text(
            json.dumps({"format": EVAL_FORMAT, "updates": 10, "summary": summary})
        )
    out = tmp_path / "out"
    compare.compare([tmp_path], out)
    assert (
        "| cory | 10 | 2 | 1.000 ± 0.000 | 0.500 ± 0.707 |"
        in (out / "reference_use.md").read_text()
    )
    rows = list(csv.DictReader((out / "reference_use.csv").open()))
    assert [(r["seed"], float(r["given_right"]), float(r["given_wrong"])) for r in rows] == [
        ("0", 1.0, 0.0),
        ("1", 1.0, 1.0),
    ]
    other = tmp_path / "other"
    fake_run(other / "ppo-0", "ppo", 0, 0.1, [0.1], 0.1, evaluation=(0.3, 1.0))
    compare.compare([other], tmp_path / "out2")
    assert not (tmp_path / "out2" / "reference_use.md").exists()
