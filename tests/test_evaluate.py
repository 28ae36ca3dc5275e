"""Evaluation on a fixed held-out set: every agent in every role, the base model paired."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cory_rl.train.commands import evaluate as ev
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.evaluation import evaluator, report
from cory_rl.train.evaluation.eval_set import EvalSet
from cory_rl.train.evaluation.evaluator import Evaluator
from cory_rl.train.training.run import run_training
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def cory_run(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "cory"
    run_training(tiny_config(tiny_model_dir, path, "cory", iterations=2))
    return path


def test_every_agent_plays_every_role_beside_the_reference(cory_run, capsys):
    flags = ["--batch_size", "8", "--samples", "2", "--max_queries", "5", "--show", "1"]
    (result,) = ev.main([str(cory_run), *flags])
    saved = json.loads((cory_run / "eval.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    cells = {(r["model"], r["agent"], r["role"]): r for r in result["rows"]}
    seats = [(a, r) for a in ("llm_0", "llm_1") for r in ("pioneer", "observer")]
    assert set(cells) == {(m, a, r) for m in ("reference", "trained") for a, r in seats}
    for row in cells.values():
        assert row["reward"]["n"] == 10 and row["reward"]["queries"] == 5  # 5 queries x 2
        lo, hi = row["reward"]["ci95"]
        assert lo <= row["reward"]["mean"] <= hi
        assert row["pass@k"] is None  # imdb is not answer-checked
        assert set(row["objective"]) == {"1e-05", "0.0001", "0.001", "0.01"}
        expected = row["reward"]["mean"] - 0.01 * row["kl"]["mean"]
        assert row["objective"]["0.01"] == pytest.approx(expected)
        assert 0 <= row["repetitive"] <= 1 and 0 <= row["hit_budget"] <= 1
        assert row["entropy"] > 0 and 1 <= row["length"] <= 4
    # The base model is its own reference: KL 0 (up to the KV cache's rounding); the trained
    # agents moved away from it.
    assert all(abs(cells["reference", a, r]["kl"]["mean"]) < 1e-5 for a, r in seats)
    assert all(cells["trained", a, r]["kl"]["mean"] > 0 for a, r in seats)
    assert all(cells["trained", a, r]["reward_minus_base"]["queries"] == 5 for a, r in seats)
    assert result["held_out"]["held_out"] and result["held_out"]["task_settings"]["split"] == "test"
    assert result["updates"] == 2 and result["common_random_numbers"]
    # Each rotation plays the same queries: the pioneer seat moved, the queries did not.
    trained = result["samples"]["trained"]
    assert [s["pioneer"]["agent"] for s in trained] == ["llm_0", "llm_1"]
    assert trained[0]["query"] == trained[1]["query"]
    assert result["summary"]["trained"]["all"]["n"] == 40
    md = (cory_run / "eval.md").read_text()
    assert "| model | agent | role | answers | reward | 95% CI | reward - base |" in md
    assert "| trained | llm_1 | observer |" in md and "distinct-2 (pooled 64)" in md
    out, err = capsys.readouterr()
    assert md.splitlines()[0] in out
    # The size is said before the first batch, then a bar counts the batches with the time left.
    size = (
        "evaluation: 5 held-out queries x 2 samples = 10 answers per role order, 2 role "
        "orders, 2 models: 8 batches of 5 games"
    )
    assert size in err and err.index(size) < err.index("evaluating") and "8/8" in err


def test_eval_json_records_every_answer_and_its_summaries_recompute(cory_run):
    evaluator.evaluate_run(cory_run, samples=1, max_queries=2)  # an earlier evaluation, to be kept
    result = evaluator.evaluate_run(cory_run, samples=3, max_queries=4, batch_size=5)
    answers = result["answers"]
    # 2 models x 2 agents x 2 roles x 4 queries x 3 samples, each (query, sample) once per cell.
    assert len(answers["model"]) == 96 and set(answers) == set(report.ANSWER_COLUMNS)
    for model, agent, role in report.cells(answers):
        keys = [
            (q, s)
            for m, a, r, q, s in zip(
                answers["model"],
                answers["agent"],
                answers["role"],
                answers["query"],
                answers["sample"],
                strict=True,
            )
            if (m, a, r) == (model, agent, role)
        ]
        assert sorted(keys) == [(q, s) for q in range(4) for s in range(3)]
    budgets = result["eval_set"]["budgets"]
    columns = zip(answers["query"], answers["sample"], answers["budget"], strict=True)
    assert all(b == budgets[q][s] for q, s, b in columns)
    assert all(n <= b for n, b in zip(answers["length"], answers["budget"], strict=True))
    saved = json.loads((cory_run / "eval.json").read_text())
    rows, summary = report.summarise(saved["answers"], saved["etas"])
    assert rows == saved["rows"] and summary == saved["summary"]
    # The earlier evaluation was kept beside it, not overwritten.
    assert len(list(cory_run.glob("eval-*.json"))) >= 1


def test_the_set_is_the_same_for_every_learner_group_and_batch_size(tiny_model_dir, tmp_path):
    sets = []
    for algorithm, batch, settings in [
        ("ppo", 4, {}),
        ("cory", 8, {}),
        ("grpo", 8, {"group_size": 4}),
        ("rloo", 6, {"group_size": 2}),
    ]:
        config = tiny_config(
            tiny_model_dir,
            tmp_path / algorithm,
            algorithm,
            batch_size=batch,
            learner={"mini_batch_size": 2},
            **settings,
        )
        game, _ = build_game_and_learners(config)
        for eval_batch in (3, 32):
            evaluator = Evaluator(config, game.tokenizers, samples=2, batch_size=eval_batch)
            sets.append(evaluator.eval_set.describe())
            assert evaluator.game.group_size == 1
    assert all(s == sets[0] for s in sets)
    # Every distinct held-out opening (cut to 2-7 tokens of the tiny vocabulary, many agree).
    texts = [q.text for q in evaluator.game.task.queries]
    assert len(texts) == 75 and sets[0]["queries"] == list(dict.fromkeys(texts))
    budgets = np.asarray(sets[0]["budgets"])
    n = len(sets[0]["queries"])
    assert budgets.shape == (n, 2) and len(np.unique(budgets)) > 2  # per answer, not per batch


def test_an_eval_set_drops_duplicates_and_fixes_budgets_by_query_and_sample():
    es = EvalSet.build(["a", "b", "a", "c", "b"], samples=3, seed=7, budget=(2, 9))
    assert es.texts == ("a", "b", "c") and es.task_index == (0, 1, 3)
    again = EvalSet.build(["a", "b", "a", "c", "b", "d"], samples=3, seed=7, budget=(2, 9))
    assert again.budgets()[:3].tolist() == es.budgets().tolist()  # more queries change none
    assert EvalSet.build(["a", "b", "c"], 3, 8, (2, 9)).budgets().tolist() != es.budgets().tolist()
    assert np.array_equal(es.noise(1, 2, 0), again.noise(1, 2, 0))
    assert not np.array_equal(es.noise(1, 2, 0), es.noise(1, 2, 1))  # each role its own
    queries, samples = es.items()
    assert queries.tolist() == [0, 1, 2] * 3 and samples.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    size, batches = es.batches(4)  # 9 answers: 3 batches of 3, not 4 + 4 + 1
    assert size == 3 and [b.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    size, batches = EvalSet.build(list("abcde"), 2, 0, (1, 2)).batches(4)
    assert size == 4 and [len(b) for b in batches] == [4, 4, 2]
    with pytest.raises(ValueError, match="eval_samples must be >= 1"):
        EvalSet.build(["a"], 0, 0, (1, 2))


def test_an_identical_policy_paired_with_the_base_differs_by_exactly_zero(tiny_model_dir, tmp_path):
    """Common random numbers: a copy of the base model, with another seed (so another own
    random stream), gives the same answers; without them the draws differ."""
    config = tiny_config(tiny_model_dir, tmp_path / "a", "cory")
    game, base_learners = build_game_and_learners(config)
    _, copy_learners = build_game_and_learners(
        tiny_config(tiny_model_dir, tmp_path / "b", "cory", seed=5)
    )
    evaluator = Evaluator(config, game.tokenizers, samples=2, batch_size=8, max_queries=6)
    base, *_ = evaluator.play(base_learners, report.REFERENCE)
    same, *_, common = evaluator.play(copy_learners, report.TRAINED)
    assert common and same["text"] == base["text"] and same["reward"] == base["reward"]
    rows, summary = report.summarise(report.concat(base, same))
    for row in rows:
        if row["model"] == report.TRAINED:
            assert row["reward_minus_base"]["mean"] == 0.0
            assert row["reward_minus_base"]["ci95"] == [0.0, 0.0]
    assert summary["trained"]["all"]["reward_minus_base"]["mean"] == 0.0
    # The same two learners on their own random streams answer differently.
    game.reset(seed=0)
    texts = []
    for learners in (base_learners, copy_learners):
        game.reset(seed=0)
        while not game.done:
            agent = game.agent_selection
            game.step(learners[agent].act(game.observe(agent)), agent=agent)
        texts.append(game.responses["llm_0"])
    assert texts[0] != texts[1]


def test_evaluation_leaves_the_learners_own_random_streams_alone(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path / "a", "ppo")
    game, learners = build_game_and_learners(config)
    agent = learners["llm_0"]
    before = agent.sampler.generator.get_state().clone()
    evaluator = Evaluator(config, game.tokenizers, samples=1, batch_size=4, max_queries=4)
    evaluator.play(learners, report.REFERENCE)
    assert torch_equal(agent.sampler.generator.get_state(), before)
    assert agent.sampler.noise is None  # back on its own stream


def torch_equal(a, b):
    import torch

    return bool(torch.equal(a, b))


def test_arith_reports_pass_at_k_on_distinct_problems_training_never_draws(
    tiny_model_dir, tmp_path
):
    from cory_env.tasks import make_task

    config = tiny_config(tiny_model_dir, tmp_path / "unused", "ppo", task="arith")
    result = evaluator.evaluate(config, None, batch_size=8, samples=4, max_queries=6)
    (row,) = result["rows"]
    assert (row["model"], row["agent"], row["role"]) == ("reference", "llm_0", "pioneer")
    assert set(row["pass@k"]) == {"1", "2", "4"}
    assert result["held_out"]["task_settings"]["seed"] == 1
    assert "dropped" in result["held_out"]["note"]
    queries = result["eval_set"]["queries"]
    training = {q.text for q in make_task("arith").queries}
    assert len(queries) == len(set(queries)) == 6 and not training & set(queries)


def test_base_model_alone_from_the_command_line(tiny_model_dir, tmp_path):
    out = tmp_path / "base"
    flags = ["--task", "imdb", "--model", tiny_model_dir, "--algorithm", "ppo", "--out", str(out)]
    (result,) = ev.main([*flags, "--batch_size", "4", "--max_queries", "4", "--device", "cpu"])
    assert [r["model"] for r in result["rows"]] == ["reference"]
    assert (out / "eval.json").is_file() and (out / "eval.md").is_file()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--samples", "0"], "eval_samples"),
        (["--batch_size", "0"], "eval_batch_size"),
        (["--max_queries", "0"], "eval_queries"),
    ],
)
def test_settings_that_evaluate_nothing_are_refused_before_a_model_loads(
    cory_run, flags, message, capsys
):
    before = (cory_run / "eval.json").read_bytes() if (cory_run / "eval.json").exists() else None
    with pytest.raises(SystemExit):
        ev.main([str(cory_run), *flags])
    assert message in capsys.readouterr().err
    after = (cory_run / "eval.json").read_bytes() if (cory_run / "eval.json").exists() else None
    assert after == before


def test_pass_at_k_of_a_cell_comes_from_its_queries():
    answers = report.empty_answers()
    for i, reward in enumerate([1.0, 0, 0, 0, 1, 1, 1, 1]):
        row = {
            "model": "reference",
            "agent": "llm_0",
            "role": "pioneer",
            "query": i // 4,
            "sample": i % 4,
            "budget": 3,
            "reward": reward,
            "kl": 0.0,
            "entropy": None,
            "length": 3,
            "hit_budget": False,
            "text": "the answer is 4",
        }
        for column, value in row.items():
            answers[column].append(value)
    row = report.cell_metrics(answers, np.arange(8), (0.01,), checked=True, base=None)
    # query 0: 1 of 4 correct -> pass@1 1/4, pass@2 1 - C(3,2)/C(4,2) = 1/2; query 1: all.
    assert row["pass@k"] == {"1": 0.625, "2": 0.75, "4": 1.0}
    assert row["entropy"] is None and row["reward"]["mean"] == 0.625


def test_pass_at_k_pooled_over_agents_averages_each_agents_pass_at_k():
    """Two agents sharing sampling uniforms answer alike; pooling their 2 x 2 answers to a
    query as n = 4 would read pass@2 1 - C(2,2)/C(4,2) = 5/6, not the agents' 1/2."""
    answers = report.empty_answers()
    for agent, rewards in (("llm_0", [1.0, 0, 1, 1]), ("llm_1", [1.0, 0, 0, 0])):
        for i, reward in enumerate(rewards):
            row = {
                "model": "trained",
                "agent": agent,
                "role": "pioneer",
                "query": i // 2,
                "sample": i % 2,
                "budget": 3,
                "reward": reward,
                "kl": 0.0,
                "entropy": None,
                "length": 3,
                "hit_budget": False,
                "text": "4",
            }
            for column, value in row.items():
                answers[column].append(value)
    pooled = report.pass_at_k_by_agent(answers, np.arange(8))
    # llm_0: query 0 pass@1 1/2, pass@2 1; query 1 1 and 1 -> 0.75, 1.0
    # llm_1: query 0 1/2 and 1; query 1 0 and 0 -> 0.25, 0.5; mean over the agents:
    assert pooled == {"1": 0.5, "2": 0.75}
    assert report.pass_at_k_by_agent(answers, np.arange(4)) == {"1": 0.75, "2": 1.0}


def test_paired_difference_is_matched_answer_by_answer_and_averaged_per_query():
    def table(model, rewards):
        answers = report.empty_answers()
        for (q, s), reward in rewards.items():
            row = {
                "model": model,
                "agent": "llm_0",
                "role": "pioneer",
                "query": q,
                "sample": s,
                "budget": 3,
                "reward": reward,
                "kl": None,
                "entropy": None,
                "length": 3,
                "hit_budget": False,
                "text": "x",
            }
            for column, value in row.items():
                answers[column].append(value)
        return answers

    base = table("reference", {(0, 0): 0.0, (0, 1): 1.0, (1, 0): 0.5, (1, 1): 0.5})
    trained = table("trained", {(0, 1): 2.0, (0, 0): 1.0, (1, 1): 0.5, (1, 0): 0.25})
    diff = report.paired_difference(trained, np.arange(4), base, report.REFERENCE)
    # query 0: (1 - 0 + 2 - 1) / 2 = 1; query 1: (0.25 - 0.5 + 0) / 2 = -0.125; mean 0.4375
    assert diff["mean"] == pytest.approx(0.4375) and diff["queries"] == 2 and diff["pairs"] == 4


@pytest.mark.parametrize(
    ("task", "settings", "held_out", "changed"),
    [
        ("imdb", {}, True, {"split": "test"}),
        ("imdb", {"dataset": "stanfordnlp/imdb"}, True, {"split": "test"}),
        ("imdb", {"dataset": "reviews.jsonl"}, False, {}),
        ("imdb", {"split": "all"}, False, {}),
        ("gsm8k", {"dataset": "openai/gsm8k", "split": "train"}, True, {"split": "test"}),
        ("gsm8k", {}, False, {}),
        ("arith", {"seed": 7, "n_steps": 2}, True, {"seed": 8}),
        ("a_task_without_a_split", {}, False, {}),
    ],
)
def test_each_task_declares_its_held_out_split(task, settings, held_out, changed):
    """The task owns its test split (``register_task(held_out=)``); evaluation names none."""
    from cory_env.tasks import held_out_split, register_task

    if task == "a_task_without_a_split":
        register_task(task, replace=True)(lambda **_: None)  # never built here
    split = held_out_split(task, settings)
    assert split.held_out == held_out and split.note
    assert split.settings == {**settings, **changed}
    assert split.minus_training == (task == "arith")


def test_reference_use_pairs_each_observer_answer_with_its_partner_s_pioneer_answer():
    """Two queries x two samples, each agent in each role: the observer's pass@1 after a
    right and after a wrong pioneer answer of the other agent, in the same game."""
    answers = report.empty_answers()
    games = [  # (pioneer agent, query, sample, pioneer right, observer right)
        ("llm_0", 0, 0, True, True),
        ("llm_0", 0, 1, True, False),
        ("llm_0", 1, 0, False, False),
        ("llm_0", 1, 1, False, True),
        ("llm_1", 0, 0, True, True),
        ("llm_1", 0, 1, False, False),
        ("llm_1", 1, 0, False, False),
        ("llm_1", 1, 1, False, False),
    ]
    for pioneer, query, sample, p_right, o_right in games:
        observer = "llm_1" if pioneer == "llm_0" else "llm_0"
        for agent, role, right in ((pioneer, "pioneer", p_right), (observer, "observer", o_right)):
            row = {
                "model": report.TRAINED,
                "agent": agent,
                "role": role,
                "query": query,
                "sample": sample,
                "budget": 4,
                "reward": float(right),
                "kl": 0.0,
                "entropy": 1.0,
                "length": 2,
                "hit_budget": False,
                "text": "1",
            }
            for column, value in row.items():
                answers[column].append(value)
    use = report.reference_use(answers, report.TRAINED)
    # right pioneers: 3 games, observers right in 2; wrong: 5 games, observers right in 1
    assert use == {
        "observer_given_right": 2 / 3,
        "observer_given_wrong": 1 / 5,
        "pioneer_right": 3,
        "pioneer_wrong": 5,
    }
    _, summary = report.summarise(answers, checked=True)
    assert summary[report.TRAINED]["observer"]["observer_given_right"] == 2 / 3
    _, unchecked = report.summarise(answers)
    assert "observer_given_right" not in unchecked[report.TRAINED]["observer"]
