"""Tasks: registry errors, IMDB query cutting and prompts, GSM8K loading, arith generation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cory_env.rewards import AnswerCheckReward, ClassifierSentimentReward, VaderSentimentReward
from cory_env.tasks import Query, Task, TaskFunctionError, available_tasks, make_task
from cory_env.tasks.arith import EXAMPLE, generate_arith_problems
from cory_env.tasks.gsm8k import EXAMPLE_ANSWER, EXAMPLE_QUESTION, load_fixture
from cory_env.tasks.imdb import load_openings

# ---------------------------------------------------------------- registry and Task


def test_registry_and_errors() -> None:
    assert {"arith", "gsm8k", "imdb"} <= set(available_tasks())
    with pytest.raises(ValueError, match="unknown task 'nope'.*arith"):
        make_task("nope")
    with pytest.raises(ValueError, match="task 'arith'.*colour"):
        make_task("arith", colour="red")


def test_task_score_rejects_bad_reward_output() -> None:
    def nan_reward(queries, responses):
        return [float("nan")] * len(responses)

    def short_reward(queries, responses):
        return [1.0]

    queries = [Query("a"), Query("b")]
    with pytest.raises(ValueError, match="row 0.*finite"):
        Task("t", queries, nan_reward).score(queries, ["x", "y"])
    with pytest.raises(ValueError, match="1 scores for 2 responses"):
        Task("t", queries, short_reward).score(queries, ["x", "y"])


# ---------------------------------------------------------------------------- imdb


def test_packaged_openings() -> None:
    openings = load_openings()
    assert len(openings) >= 320
    assert len(set(openings)) == len(openings)
    assert all(8 <= len(line.split()) <= 25 for line in openings)


def test_imdb_cuts_to_word_prefixes() -> None:
    openings = load_openings()
    task = make_task("imdb", min_query_tokens=2, max_query_tokens=8)
    assert task.name == "imdb" and len(task.queries) == len(openings)
    lengths = set()
    for query, opening in zip(task.queries, openings, strict=True):
        words = query.text.split()
        assert 2 <= len(words) <= 8
        assert opening.split()[: len(words)] == words
        lengths.add(len(words))
    assert lengths == set(range(2, 9))  # k drawn per query over the whole inclusive range
    assert task.max_new_tokens == (4, 16)
    assert isinstance(task.reward_fn, VaderSentimentReward)
    # seeded: same seed same queries, another seed other queries
    again = make_task("imdb", min_query_tokens=2, max_query_tokens=8)
    assert again.queries == task.queries
    assert make_task("imdb", seed=1).queries != task.queries
    fixed = make_task("imdb", min_query_tokens=3, max_query_tokens=3, n_queries=10, seed=5)
    assert len(fixed.queries) == 10
    assert all(len(q.text.split()) == 3 for q in fixed.queries)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A small byte-level BPE trained on the openings, so tokens are often sub-words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(load_openings(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def test_imdb_cuts_to_tokenizer_prefixes(bpe_tokenizer) -> None:
    openings = load_openings()
    task = make_task("imdb", tokenizer=bpe_tokenizer, min_query_tokens=2, max_query_tokens=6)
    word_task = make_task("imdb", min_query_tokens=2, max_query_tokens=6)
    n_tokens = set()
    for query, opening in zip(task.queries, openings, strict=True):
        ids = bpe_tokenizer.encode(opening, add_special_tokens=False)
        # the query is the decoded first k tokens of the opening, for some k in range
        ks = [k for k in range(2, 7) if bpe_tokenizer.decode(ids[:k]) == query.text]
        assert ks, (query.text, opening)
        assert opening.startswith(query.text)
        n_tokens.add(ks[0])
    assert n_tokens == set(range(2, 7))
    assert [q.text for q in task.queries] != [q.text for q in word_task.queries]


def test_imdb_prompts() -> None:
    task = make_task("imdb", n_queries=3)
    query = task.queries[0]
    assert task.prompt(0, query, []) == query.text
    expected = f'I can make this sentence "{query.text} was fine." more positive: {query.text}'
    assert task.prompt(1, query, [" was fine."]) == expected
    chained = f'I can make this sentence "{query.text} B" more positive: {query.text}'
    assert task.prompt(2, query, [" A", " B"]) == chained  # the most recent answer
    with pytest.raises(TaskFunctionError, match="imdb_prompt raised .*role 1 needs an earlier"):
        task.prompt(1, query, [])


def test_imdb_scores_query_plus_response() -> None:
    task = make_task("imdb", n_queries=2)
    good, bad = task.score(task.queries, [" a wonderful delight", " an awful disaster"])
    assert good > bad
    assert isinstance(make_task("imdb", reward="classifier", n_queries=1).reward_fn,
                      ClassifierSentimentReward)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_query_tokens": 0}, "min_query_tokens must be an integer >= 1, got 0"),
        (
            {"min_query_tokens": 5, "max_query_tokens": 4},
            "max_query_tokens must be an integer >= min_query_tokens \\(5\\), got 4",
        ),
        ({"max_query_tokens": 2.5}, "max_query_tokens must be an integer >= 1, got 2.5"),
        ({"n_queries": 100_000}, "n_queries must be at most the .* queries available, got 100000"),
        ({"n_queries": 0}, "n_queries must be an integer >= 1, got 0"),
        ({"max_new_tokens": (5, 5)}, "1 <= low < high"),
        (
            {"max_new_tokens": (1, 2, 3)},
            "max_new_tokens must be an integer >= 1 or a \\(low, high\\) pair.*got \\(1, 2, 3\\)",
        ),
        ({"reward": "sentiment"}, "unknown reward 'sentiment'"),
    ],
)
def test_imdb_setting_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_task("imdb", **settings)


def test_imdb_local_dataset(tmp_path: Path) -> None:
    path = tmp_path / "reviews.jsonl"
    rows = [
        {"text": "One<br /><br />two three four five six seven eight nine", "label": 1},
        {"text": "Alpha beta<br/>gamma delta epsilon zeta eta theta", "label": 0},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = make_task("imdb", dataset=str(path), min_query_tokens=4, max_query_tokens=4)
    assert [q.text for q in task.queries] == ["One two three four", "Alpha beta gamma delta"]
    assert task.metadata["source"] == str(path)

    no_text = tmp_path / "other.jsonl"
    no_text.write_text(json.dumps({"review": "x"}) + "\n")
    with pytest.raises(ValueError, match="other.jsonl, line 1 has no 'text' field.*review"):
        make_task("imdb", dataset=str(no_text))
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist.*dataset=None"):
        make_task("imdb", dataset=missing)


# --------------------------------------------------------------------------- gsm8k


def test_gsm8k_fixture_task() -> None:
    records = load_fixture()
    task = make_task("gsm8k")
    assert len(task.queries) == 40
    for query, record in zip(task.queries, records, strict=True):
        assert query.text == record["question"]
        assert query.answer == record["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    assert isinstance(task.reward_fn, AnswerCheckReward)
    assert (task.max_new_tokens, task.context_length) == (256, 1024)
    right = [f"Some work. The answer is {q.answer}." for q in task.queries]
    assert task.score(task.queries, right) == [1.0] * 40
    wrong = [f"The answer is {float(q.answer) + 1}" for q in task.queries]
    assert task.score(task.queries, wrong) == [0.0] * 40
    assert EXAMPLE_QUESTION not in {r["question"] for r in records}
    assert len(make_task("gsm8k", n_queries=5).queries) == 5


def test_gsm8k_prompts() -> None:
    task = make_task("gsm8k", n_queries=1)
    query = task.queries[0]
    shot = f"Question: {EXAMPLE_QUESTION}\nAnswer: {EXAMPLE_ANSWER}\n\n"
    assert EXAMPLE_ANSWER.endswith("The answer is 16.")
    assert task.prompt(0, query, []) == f"{shot}Question: {query.text}\nAnswer:"
    observer = f"{shot}Question: {query.text}\nReference: 4 * 12 = 48. The answer is 33.\nAnswer:"
    assert task.prompt(1, query, [" 4 * 12 = 48. The answer is 33.\n"]) == observer


def test_gsm8k_local_file_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"question": "What is 2 + 2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
        {"question": "What is 600 * 2?", "answer": "<<600*2=1200>>1,200\n#### 1,200"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = make_task("gsm8k", dataset=str(path))
    assert [(q.text, q.answer) for q in task.queries] == [
        ("What is 2 + 2?", "4"),
        ("What is 600 * 2?", "1200"),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "solution": "4"}) + "\n")
    with pytest.raises(ValueError, match="needs 'question' and 'answer'"):
        make_task("gsm8k", dataset=str(bad))
    no_final = tmp_path / "nofinal.jsonl"
    no_final.write_text(json.dumps({"question": "q", "answer": "just 4"}) + "\n")
    with pytest.raises(ValueError, match="nofinal.jsonl, line 1: .*####"):
        make_task("gsm8k", dataset=str(no_final))
    with pytest.raises(FileNotFoundError, match="gone.jsonl does not exist.*dataset=None"):
        make_task("gsm8k", dataset=str(tmp_path / "gone.jsonl"))


# --------------------------------------------------------------------------- arith


def _solve(text: str) -> tuple[int, list[int]]:
    """Recompute a generated problem from its words alone (see arith's template convention)."""
    *steps, question = re.split(r"(?<=[.?])\s+", text)
    assert question.endswith("?") and not re.search(r"\d", question)
    numbers = [int(n) for step in steps for n in re.findall(r"\d+", step)]
    assert len(numbers) == len(steps), text  # exactly one number per sentence
    value = numbers[0]
    for step, n in zip(steps[1:], numbers[1:], strict=True):
        if re.search(r"\btimes\b", step):
            value *= n
        elif re.search(r"\bmore\b", step):
            value += n
        else:
            value -= n
        assert value >= 0, text
    return value, numbers


@pytest.mark.parametrize(
    ("max_operand", "n_steps", "operations"),
    [(9, 1, ("+", "-")), (20, 3, ("+", "-", "*")), (5, 4, ("-",)), (9, 2, ("*",))],
)
def test_arith_answers_are_correct(max_operand: int, n_steps: int, operations: tuple) -> None:
    problems = generate_arith_problems(
        300, max_operand=max_operand, n_steps=n_steps, operations=operations, seed=3
    )
    assert len(problems) == 300
    for problem in problems:
        value, numbers = _solve(problem.text)
        assert problem.answer == str(value)
        assert len(numbers) == n_steps + 1
        assert all(1 <= n <= max_operand for n in numbers)
    assert len({p.text for p in problems}) > 200  # varied, not one template


def test_arith_uses_every_operation_and_is_seeded() -> None:
    problems = generate_arith_problems(200, n_steps=2, operations=("+", "-", "*"), seed=0)
    text = " ".join(p.text for p in problems)
    assert re.search(r"\bmore\b", text) and re.search(r"\btimes\b", text)
    assert any(_solve(p.text)[0] < _solve(p.text)[1][0] for p in problems)  # some losses
    assert generate_arith_problems(20, seed=4) == generate_arith_problems(20, seed=4)
    assert generate_arith_problems(20, seed=4) != generate_arith_problems(20, seed=5)


def test_arith_task_prompts_and_reward() -> None:
    task = make_task("arith", n_queries=8)
    assert len(task.queries) == 8
    query = task.queries[0]
    assert EXAMPLE == (
        "Q: Tom has 2 apples and gets 3 more. How many apples does Tom have?\nA: The answer is 5.\n"
    )
    assert task.prompt(0, query, []) == f"{EXAMPLE}Q: {query.text}\nA:"
    assert task.prompt(1, query, [" The answer is 7. "]) == (
        f"{EXAMPLE}Q: {query.text}\nReference answer: The answer is 7.\nA:"
    )
    responses = [f" The answer is {q.answer}." for q in task.queries]
    assert task.score(task.queries, responses) == [1.0] * 8
    assert task.score(task.queries[:1], [" The answer is 1000."]) == [0.0]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"n_queries": 0}, "n_queries must be an integer >= 1, got 0"),
        ({"max_operand": -1}, "max_operand must be an integer >= 1, got -1"),
        ({"n_steps": 1.5}, "n_steps must be an integer >= 1, got 1.5"),
        ({"n_steps": True}, "n_steps must be an integer >= 1, got True"),
        ({"operations": ("/",)}, "operations must be a non-empty selection.*'/'"),
        ({"operations": ()}, "operations must be a non-empty selection"),
        (
            {"operations": ("-",), "n_steps": 4, "max_operand": 3},
            "max_operand must be >= n_steps \\(4\\) with only subtraction, got 3",
        ),
        ({"context_length": 0}, "context_length must be an integer >= 2, got 0"),
        (
            {"max_new_tokens": 0},
            "max_new_tokens must be an integer >= 1 or a \\(low, high\\) pair.*got 0",
        ),
    ],
)
def test_arith_setting_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_task("arith", **settings)
