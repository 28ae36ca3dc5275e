"""compare.py: runs grouped by everything but the seed, curves with their spread, frontier."""

from __future__ import annotations

import csv
import json

import pytest

from train import compare
from train.config import build_config


def fake_run(path, algorithm, seed, kl_coef, scores, kl, evaluation=None):
    """A run folder as training and evaluation leave it, without training anything."""
    path.mkdir(parents=True)
    overrides = {"seed": seed, "run_dir": str(path), "ppo": {"init_kl_coef": kl_coef}}
    build_config("smoke", overrides=overrides, algorithm=algorithm).save(path / "config.yaml")
    rows = []
    for it, score in enumerate(scores):
        row = {"iteration": it}
        for prefix in ("llm_0", "pioneer"):
            row.update({f"{prefix}/score": score, f"{prefix}/kl": kl * it,
                        f"{prefix}/objective": score - 0.01 * kl * it})  # fmt: skip
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evaluation is not None:
        reward, test_kl = evaluation
        summary = {"trained": {"pioneer": {"reward": reward, "kl": test_kl, "n": 8}},
                   "reference": {"pioneer": {"reward": 0.1, "kl": 0.0, "n": 8}}}  # fmt: skip
        (path / "eval.json").write_text(json.dumps({"summary": summary}))
    return path


def test_runs_group_by_everything_but_the_seed(tmp_path):
    paths = [
        fake_run(tmp_path / "a0", "ppo", 0, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "b0", "ppo", 0, 0.2, [0.0], 1.0),
        fake_run(tmp_path / "a1", "ppo", 1, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "c0", "cory", 0, 0.1, [0.0], 1.0),
        fake_run(tmp_path / "a2", "ppo", 2, 0.1, [0.0], 1.0),
    ]
    groups = compare.group_runs([compare.load_run(p) for p in paths])
    assert [(g.label, [r.path.name for r in g.runs]) for g in groups] == [
        ("ppo init_kl_coef=0.1", ["a0", "a1", "a2"]),
        ("ppo init_kl_coef=0.2", ["b0"]),
        ("cory", ["c0"]),  # nothing varies between cory groups: the algorithm alone
    ]
    # A sweep folder stands for the run folders inside it.
    assert compare.run_folders([tmp_path]) == sorted(paths)


def test_curves_and_frontier_files(tmp_path, capsys):
    runs = tmp_path / "sweep"
    fake_run(runs / "p1", "ppo", 0, 0.1, [0.0, 0.2, 0.4], 1.0, evaluation=(0.5, 4.0))
    fake_run(runs / "p2", "ppo", 1, 0.1, [0.2, 0.4, 0.8], 3.0, evaluation=(0.7, 6.0))
    fake_run(runs / "p3", "ppo", 0, 0.2, [0.0, 0.1, 0.2], 1.0, evaluation=(0.4, 5.0))
    fake_run(runs / "c1", "cory", 0, 0.1, [0.1, 0.3, 0.5], 0.5, evaluation=(0.6, 2.0))
    written = compare.main([str(runs), "--out", str(tmp_path / "out")])
    names = {p.name for p in written}
    assert names == {"curves-agents.png", "curves-agents.csv", "curves-roles.png",
                     "curves-roles.csv", "frontier.png", "frontier.csv", "summary.csv",
                     "summary.md"}  # fmt: skip
    with (tmp_path / "out" / "curves-agents.csv").open() as f:
        table = list(csv.DictReader(f))
    two_seeds = [r for r in table if r["group"] == "ppo init_kl_coef=0.1" and r["quantity"] ==
                 "score" and r["iteration"] == "2"]  # fmt: skip
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
        "p1": "True", "p2": "True", "p3": "False", "c1": "True",
    }  # fmt: skip
    assert float(frontier["c1"]["r - 0.01 KL"]) == pytest.approx(0.6 - 0.02)
    printed = capsys.readouterr().out
    assert "ppo init_kl_coef=0.1: 2 seed(s)" in printed
    summary = {r["group"]: r for r in csv.DictReader((tmp_path / "out" / "summary.csv").open())}
    two = summary["ppo init_kl_coef=0.1"]  # rewards 0.5 and 0.7 beside a base of 0.1
    assert two["seeds"] == "2" and two["games_per_seed"] == "8"
    assert float(two["reward_mean"]) == pytest.approx(0.6)
    assert float(two["reward_std"]) == pytest.approx(0.1414214, rel=1e-6)
    assert float(two["reward_minus_base_mean"]) == pytest.approx(0.5)
    assert float(two["kl_mean"]) == pytest.approx(5.0)
    assert float(summary["cory"]["reward_std"]) == 0.0  # one seed
    assert "| ppo init_kl_coef=0.1 | 2 | 8 | 0.600 ± 0.141 | 0.100 ± 0.000 |" in printed
