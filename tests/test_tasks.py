"""Tasks: registry errors, IMDB query cutting and prompts, GSM8K loading, arith generation."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import cory_env
from cory_env import batched_game, custom_task, register_task
from cory_env.checks import DataError, SettingError
from cory_env.rewards import AnswerCheckReward, ClassifierSentimentReward, VaderSentimentReward
from cory_env.tasks import (
    Query,
    Task,
    TaskFunctionError,
    available_tasks,
    make_task,
    registry,
    task_needs_tokenizer,
)
from cory_env.tasks.arith import (
    EQUATION_EXAMPLES,
    EXAMPLE,
    WORD_EXAMPLES,
    generate_arith_problems,
)
from cory_env.tasks.gsm8k import EXAMPLE_ANSWER, EXAMPLE_QUESTION, load_fixture
from cory_env.tasks.imdb import OBSERVER_TEMPLATE, load_openings

# ---------------------------------------------------------------- registry and Task


def test_registry_and_errors() -> None:
    assert {"arith", "gsm8k", "imdb"} <= set(available_tasks())
    with pytest.raises(ValueError, match="unknown task 'nope'.*arith"):
        make_task("nope")
    with pytest.raises(ValueError, match="task 'arith'.*colour"):
        make_task("arith", colour="red")


def test_no_import_cycles_in_cory_env() -> None:
    """Module-level imports inside cory_env form no cycle, and none is hidden from the check
    under TYPE_CHECKING (a package's __init__ importing its own modules is not a cycle)."""
    root = Path(cory_env.__file__).parent
    modules = {}
    for file in root.rglob("*.py"):
        parts = file.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        source = file.read_text(encoding="utf-8")
        assert "TYPE_CHECKING" not in source, name
        edges = set()
        for node in ast.parse(source).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cory_env"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("cory_env")}
        graph[name] = edges

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, " -> ".join([*path, name])
        for nxt in graph.get(name, ()):
            visit(nxt, [*path, name])

    for name in graph:
        visit(name, [])
    leaves = ("cory_env.query", "cory_env.answer_check", "cory_env.checks", "cory_env.models")
    assert all(not graph[leaf] for leaf in leaves)
    assert "cory_env.answer_check" in graph["cory_env.rewards"]


@pytest.fixture()
def scratch_registry():
    """Tasks registered by a test are removed after it."""
    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


def test_registry_declares_the_tokenizer_need(scratch_registry, tiny_tokenizer) -> None:
    seen = {}

    @register_task("wants_tok", needs_tokenizer=True)
    def make_wants(tokenizer=None, **settings):
        seen["wants"] = tokenizer
        return custom_task(["the movie"], lambda q, r: [0.0] * len(r), name="wants_tok")

    @register_task("no_tok")
    def make_no(**settings):  # accepts anything, but did not ask for a tokenizer
        seen["no"] = settings
        return custom_task(["the movie"], lambda q, r: [0.0] * len(r), name="no_tok")

    assert task_needs_tokenizer("wants_tok") and not task_needs_tokenizer("no_tok")
    assert task_needs_tokenizer("imdb") and not task_needs_tokenizer("arith")
    batched_game("wants_tok", tokenizer=tiny_tokenizer)
    assert seen["wants"] is tiny_tokenizer  # the pioneer seat's tokenizer
    batched_game("no_tok", tokenizer=tiny_tokenizer)
    assert seen["no"] == {}
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        task_needs_tokenizer("nope")


def test_registry_refuses_nonsense(scratch_registry) -> None:
    def make(**settings):
        return custom_task(["q"], lambda q, r: [0.0] * len(r))

    with pytest.raises(ValueError, match="task 'arith' is already registered.*replace=True"):
        register_task("arith")(make)
    assert make_task("arith").name == "arith"
    register_task("arith", replace=True)(make)
    assert make_task("arith").name == "custom"
    message = r"register_task: name must be a non-empty string.*use @register_task\('name'\)"
    with pytest.raises(ValueError, match=message):
        register_task(make)
    with pytest.raises(ValueError, match="needs_tokenizer must be true or false, got 1"):
        register_task("x", needs_tokenizer=1)
    with pytest.raises(TypeError, match="decorates a task factory"):
        register_task("x")("not a function")
    register_task("not_a_task")(lambda **s: ["q"])
    message = "task 'not_a_task': its factory .* must return a Task, got list"
    with pytest.raises(TypeError, match=message):
        make_task("not_a_task")


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
    openings = load_openings("train")  # the default split: the held-out fifth left out
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
    # The defaults: 2..7 tokens, the official LengthSampler(2, 8), i.e. range(2, 8).
    default = make_task("imdb")
    assert default.metadata["query_tokens"] == (2, 7)
    assert {len(q.text.split()) for q in default.queries} == set(range(2, 8))
    assert isinstance(task.reward_fn, VaderSentimentReward)
    # seeded: same seed same queries, another seed other queries
    again = make_task("imdb", min_query_tokens=2, max_query_tokens=8)
    assert again.queries == task.queries
    assert make_task("imdb", seed=1).queries != task.queries
    fixed = make_task("imdb", min_query_tokens=3, max_query_tokens=3, n_queries=10, seed=5)
    assert len(fixed.queries) == 10
    assert all(len(q.text.split()) == 3 for q in fixed.queries)


def test_packaged_openings_hold_out_a_fixed_test_fifth() -> None:
    """Training (the default split) never draws an opening that evaluation uses."""
    every, train, test = load_openings(), load_openings("train"), load_openings("test")
    assert test == every[4::5] and len(test) == len(every) // 5
    assert not set(train) & set(test) and sorted(train + test) == sorted(every)
    default = make_task("imdb", min_query_tokens=8, max_query_tokens=8)
    held_out = make_task("imdb", split="test", min_query_tokens=8, max_query_tokens=8)
    assert [q.text for q in default.queries] == [" ".join(t.split()[:8]) for t in train]
    assert [q.text for q in held_out.queries] == [" ".join(t.split()[:8]) for t in test]
    assert len(make_task("imdb", split="all").queries) == len(every)
    assert held_out.metadata["split"] == "test"
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'test', 'all'\]"):
        make_task("imdb", split="validation")


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
    openings = load_openings("train")
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
    q = query.text
    several = f'I can make these sentences "{q} A", "{q} B" more positive: {q}'
    assert task.prompt(2, query, [" A", " B"]) == several  # every answer given, in order
    three = f'I can make these sentences "{q} A", "{q} B", "{q}!" more positive: {q}'
    assert task.prompt(3, query, [" A", " B", "!"]) == three
    # The chain (the game's default sees="previous") gives one answer: the official text.
    assert task.prompt(2, query, [" B"]) == OBSERVER_TEMPLATE.format(sentence=q + " B", query=q)
    with pytest.raises(TaskFunctionError, match="imdb_prompt raised .*role 1 needs an earlier"):
        task.prompt(1, query, [])


def test_imdb_scores_query_plus_response() -> None:
    task = make_task("imdb", n_queries=2)
    good, bad = task.score(task.queries, [" a wonderful delight", " an awful disaster"])
    assert good > bad
    assert isinstance(
        make_task("imdb", reward="classifier", n_queries=1).reward_fn, ClassifierSentimentReward
    )


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
    task = make_task(
        "imdb", dataset=str(path), min_query_tokens=4, max_query_tokens=4, min_review_chars=0
    )
    assert [q.text for q in task.queries] == ["One two three four", "Alpha beta gamma delta"]
    assert task.metadata["source"] == str(path)

    no_text = tmp_path / "other.jsonl"
    no_text.write_text(json.dumps({"review": "x"}) + "\n")
    with pytest.raises(ValueError, match="other.jsonl, line 1 has no 'text' field.*review"):
        make_task("imdb", dataset=str(no_text))
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist.*dataset=None"):
        make_task("imdb", dataset=missing)


def _review(n_chars: int, word: str) -> str:
    """A review of exactly ``n_chars`` characters whose first word is ``word``."""
    text = (word + " was a good film and the story was fun " * 40)[:n_chars]
    assert len(text) == n_chars
    return text


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_imdb_keeps_reviews_longer_than_min_review_chars(tmp_path: Path, suffix) -> None:
    """As the official PPO script (len(review) > 200): strictly longer, raw text, 0 keeps all."""
    lengths = {"short": 150, "exact": 200, "long": 201, "longer": 600}
    reviews = [_review(n, word) for word, n in lengths.items()]
    path = tmp_path / f"reviews{suffix}"
    if suffix == ".txt":
        path.write_text("\n".join(reviews) + "\n")
    else:
        path.write_text("\n".join(json.dumps({"text": r}) for r in reviews) + "\n")

    def first_words(**settings):
        task = make_task(
            "imdb", dataset=str(path), min_query_tokens=1, max_query_tokens=1, **settings
        )
        return [q.text for q in task.queries], task.metadata["min_review_chars"]

    assert first_words() == (["long", "longer"], 200)  # the default: > 200 characters
    assert first_words(min_review_chars=0) == (["short", "exact", "long", "longer"], 0)
    assert first_words(min_review_chars=149) == (["short", "exact", "long", "longer"], 149)
    assert first_words(min_review_chars=201) == (["longer"], 201)
    with pytest.raises(
        ValueError, match=r"no review .* longer than min_review_chars=600 .*has 600"
    ):
        first_words(min_review_chars=600)
    # The packaged openings (short by design) are never filtered.
    packaged = make_task("imdb", min_review_chars=10**6)
    assert len(packaged.queries) == len(load_openings("train"))
    assert packaged.metadata["min_review_chars"] is None


@pytest.mark.parametrize("value", [-1, True, 2.5, "200"])
def test_imdb_min_review_chars_refused(value) -> None:
    with pytest.raises(
        ValueError, match=rf"task 'imdb': min_review_chars must be an integer >= 0, got {value!r}"
    ):
        make_task("imdb", min_review_chars=value)


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
    two = f"{shot}Question: {query.text}\nReference: It is 4.\nReference: It is 5.\nAnswer:"
    assert task.prompt(2, query, [" It is 4.", "It is 5.\n"]) == two  # one line per answer
    with pytest.raises(TaskFunctionError, match="role 1 needs an earlier response"):
        task.prompt(1, query, [])


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


def test_gsm8k_offline_hub_dataset_is_one_line_naming_the_fixture(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        make_task("gsm8k", dataset="openai/gsm8k")
    message = str(err.value)
    assert message.startswith("task 'gsm8k': could not load dataset 'openai/gsm8k'")
    assert "dataset=None" in message and "\n" not in message


# ---------------------------------------------------------------- local data files


def _gsm8k_line(answer: str = "2+2=4\n#### 4") -> str:
    return json.dumps({"question": "What is 2 + 2?", "answer": answer})


@pytest.mark.parametrize(
    ("task", "name", "content", "error", "message"),
    [
        (
            "gsm8k",
            "a.jsonl",
            _gsm8k_line() + "\n{not json\n",
            ValueError,
            r"a.jsonl, line 2: not valid JSON \(.*column 2\): '\{not json'",
        ),
        (
            "gsm8k",
            "a.jsonl",
            _gsm8k_line() + "\n\n[1, 2]\n",
            ValueError,
            r"a.jsonl, line 3: expected a JSON object .*got list",
        ),
        (
            "gsm8k",
            "a.json",
            "[" + _gsm8k_line() + ",\n oops]",
            ValueError,
            r"a.json, line 2: not valid JSON",
        ),
        ("gsm8k", "a.jsonl", "", ValueError, r"task 'gsm8k': .*a.jsonl is empty"),
        ("gsm8k", "a.jsonl", "\n  \n", ValueError, r"a.jsonl is empty"),
        ("gsm8k", "a.json", "[]", ValueError, r"a.json has no records"),
        (
            "gsm8k",
            "a.jsonl",
            b'{"question": "caf\xe9"}\n',
            ValueError,
            r"a.jsonl is not UTF-8 text: byte 0xe9 on line 1",
        ),
        (
            "gsm8k",
            "a.jsonl",
            _gsm8k_line() + "\n" + _gsm8k_line("so\n#### four") + "\n",
            ValueError,
            r"a.jsonl, line 2: .*after '####' is not a number: 'four'",
        ),
        (
            "gsm8k",
            "a.jsonl",
            _gsm8k_line("#### 5 apples"),
            ValueError,
            r"line 1: .*not a number: '5 apples'",
        ),
        (
            "gsm8k",
            "a.jsonl",
            json.dumps({"question": "q", "answer": 4}),
            ValueError,
            r"a.jsonl, line 1: 'answer' must be text, got int '4'",
        ),
        (
            "gsm8k",
            "a.jsonl",
            json.dumps({"question": " ", "answer": "#### 4"}),
            ValueError,
            r"a.jsonl, line 1 has an empty question",
        ),
        (
            "imdb",
            "r.jsonl",
            '{"text": "good"}\n{"text": "bad",}\n',
            ValueError,
            r"task 'imdb': .*r.jsonl, line 2: not valid JSON",
        ),
        (
            "imdb",
            "r.jsonl",
            '{"text": "good"}\n{"text": null}\n',
            ValueError,
            r"r.jsonl, line 2: 'text' must be text, got NoneType",
        ),
        ("imdb", "r.jsonl", "", ValueError, r"r.jsonl is empty"),
        (
            "imdb",
            "r.txt",
            b"one good film\nbad \xff\xfe\n",
            ValueError,
            r"r.txt is not UTF-8 text: byte 0xff on line 2",
        ),
        ("imdb", "r.txt", "\n\n", ValueError, r"r.txt is empty"),
    ],
)
def test_bad_local_data_files(tmp_path: Path, task, name, content, error, message) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(error, match=message):
        make_task(task, dataset=str(path))


def test_local_data_file_forms(tmp_path: Path) -> None:
    array = tmp_path / "problems.json"
    array.write_text(json.dumps([json.loads(_gsm8k_line()), json.loads(_gsm8k_line("#### 7"))]))
    assert [q.answer for q in make_task("gsm8k", dataset=array).queries] == ["4", "7"]  # a Path
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes("\ufeff".encode() + (_gsm8k_line() + "\r\n").encode())  # BOM, CRLF
    assert [q.answer for q in make_task("gsm8k", dataset=str(bom)).queries] == ["4"]
    texts = tmp_path / "reviews.txt"
    texts.write_text("A line\u2028with a separator\n\nSecond review here\n", encoding="utf-8")
    task = make_task(
        "imdb", dataset=str(texts), min_query_tokens=8, max_query_tokens=8, min_review_chars=0
    )
    assert [q.text for q in task.queries] == ["A line with a separator", "Second review here"]
    with pytest.raises(ValueError, match="task 'gsm8k': dataset must be a non-empty string"):
        make_task("gsm8k", dataset=3)
    with pytest.raises(FileNotFoundError, match="r.csv does not exist.*dataset=None"):
        make_task("imdb", dataset=str(tmp_path / "r.csv"))


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
    assert task.prompt(2, query, [" The answer is 7. ", "The answer is 8."]) == (
        f"{EXAMPLE}Q: {query.text}\nReference answer: The answer is 7.\n"
        "Reference answer: The answer is 8.\nA:"
    )
    responses = [f" The answer is {q.answer}." for q in task.queries]
    assert task.score(task.queries, responses) == [1.0] * 8
    assert task.score(task.queries[:1], [" The answer is 1000."]) == [0.0]


def test_arith_shots_put_solved_examples_before_the_query() -> None:
    words = make_task("arith", n_queries=4, shots=3)
    query = words.queries[0]
    assert words.prompt(0, query, []) == "".join(WORD_EXAMPLES[:3]) + f"Q: {query.text}\nA:"
    assert words.prompt(1, query, ["7"]).endswith(f"Q: {query.text}\nReference answer: 7\nA:")
    assert words.context_length == 192 + 2 * 48
    bare = make_task("arith", n_queries=4, style="equation")
    assert bare.prompt(0, bare.queries[0], []) == f"{bare.queries[0].text}="
    equations = make_task("arith", n_queries=4, style="equation", shots=2)
    text = equations.queries[0].text
    assert equations.prompt(0, equations.queries[0], []) == f"2+3=5\n9-4=5\n{text}="
    assert equations.prompt(1, equations.queries[0], ["7"]) == f"2+3=5\n9-4=5\n{text}[7]="
    assert equations.context_length == 16 + 2 * 8
    for example in WORD_EXAMPLES[1:]:  # the later examples follow the generator's template
        question, answer = example.split("\nA:")
        assert _solve(question.removeprefix("Q: "))[0] == int(answer.split()[-1].rstrip("."))
    sums = [re.fullmatch(r"(\d+)([+-])(\d+)=(\d+)\n", e).groups() for e in EQUATION_EXAMPLES]
    assert all(int(a) + (int(b) if op == "+" else -int(b)) == int(c) for a, op, b, c in sums)
    assert make_task("arith", n_queries=4, shots=0).prompt(0, query, []) == (f"Q: {query.text}\nA:")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"shots": 5}, "shots must be an integer from 0 to 4, got 5"),
        ({"shots": -1}, "shots must be an integer >= 0, got -1"),
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


def test_the_equation_style_s_reference_observer_reads_as_the_official_gsm8k_one() -> None:
    """observer_prompt reference: the pioneer's prompt is unchanged; the observer sees the
    partner's answer on a labelled line before ``Answer:``, its solved examples in that
    form (one with a wrong reference corrected), an answer's line breaks made spaces."""
    bracket = make_task("arith", style="equation", shots=4)
    task = make_task("arith", style="equation", shots=4, observer_prompt="reference")
    query = task.queries[0]
    assert task.prompt(0, query, []) == bracket.prompt(0, query, [])
    prompt = task.prompt(1, query, ["9 \n4+"])
    assert prompt.endswith(f"{query.text}=\nReference: 9 4+\nAnswer:")
    assert prompt.count("Reference:") == 5 and "Reference: 12\nAnswer: 13\n" in prompt
    assert "[" not in prompt
    with pytest.raises(SettingError, match="observer_prompt 'reference' is a form of the"):
        make_task("arith", observer_prompt="reference")  # the words style labels its own
    with pytest.raises(SettingError, match="observer_prompt"):
        make_task("arith", style="equation", observer_prompt="inline")
