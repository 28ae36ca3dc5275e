"""GSM8K math word problems, the CORY paper's second task, scored by the answer checker.

Offline, a 40-problem fixture in GSM8K format written for this project is used;
with a hub, ``openai/gsm8k`` (config "main"); or any local GSM8K-format JSON(L) file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from cory_env import checks
from cory_env.answer_check import gold_answer
from cory_env.query import Query
from cory_env.rewards import AnswerCheckReward
from cory_env.tasks.base import HeldOut, Task, is_local_file, select_count
from cory_env.tasks.files import (
    Record,
    dataset_name,
    dataset_records,
    json_records,
    read_package_text,
    text_field,
)
from cory_env.tasks.registry import register_task

FIXTURE_FILE = "gsm8k_sample.jsonl"
HUB_DATASET = "openai/gsm8k"

# The one-shot example (written for this project, not taken from GSM8K).
EXAMPLE_QUESTION = (
    "A baker makes 3 trays of muffins with 12 muffins on each tray. She sells 20 muffins. "
    "How many muffins does she have left?"
)
EXAMPLE_ANSWER = (
    "She makes 3 * 12 = 36 muffins. After selling 20, she has 36 - 20 = 16 muffins left. "
    "The answer is 16."
)
ONE_SHOT = f"Question: {EXAMPLE_QUESTION}\nAnswer: {EXAMPLE_ANSWER}\n\n"


def load_fixture() -> list[dict[str, str]]:
    """The packaged GSM8K-format fixture as a list of {"question", "answer"} records."""
    return [r.data for r in json_records(read_package_text(FIXTURE_FILE), FIXTURE_FILE)]


_OFFLINE_HINT = (
    "Without a dataset hub, use dataset=None for the packaged GSM8K-format fixture, "
    "or give a local .jsonl file with 'question' and 'answer' fields."
)


def _load_records(dataset: str | None, split: str) -> tuple[str, Iterator[Record]]:
    """(the source named in messages, its records in order)."""
    if dataset is None:
        source = f"task 'gsm8k': {FIXTURE_FILE}"
        return source, iter(json_records(read_package_text(FIXTURE_FILE), source))
    return dataset_records("gsm8k", dataset, split, _OFFLINE_HINT, config="main")


def gsm8k_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """One-shot prompt; observers also see the earlier answers they are given, one
    ``Reference: ...`` line each (in order) before ``Answer:``."""
    if role == 0:
        return f"{ONE_SHOT}Question: {query.text}\nAnswer:"
    if not earlier:
        raise ValueError(f"gsm8k prompt for role {role} needs an earlier response; got none")
    references = "".join(f"Reference: {answer.strip()}\n" for answer in earlier)
    return f"{ONE_SHOT}Question: {query.text}\n{references}Answer:"


def gsm8k_held_out(settings: dict[str, Any]) -> HeldOut:
    """The hub dataset's test split; a local file and the packaged fixture have one split."""
    dataset = settings.get("dataset")
    if dataset is None or is_local_file(dataset):
        what = "the packaged GSM8K fixture" if dataset is None else f"the local file {dataset}"
        return HeldOut(settings, f"{what} has one split: training queries, not held out", False)
    return HeldOut({**settings, "split": "test"}, f"split 'test' of dataset {dataset}", True)


@register_task("gsm8k", held_out=gsm8k_held_out)
def make_gsm8k_task(
    *,
    dataset: str | None = None,
    split: str = "train",
    n_queries: int | None = None,
    max_new_tokens: int | tuple[int, int] = 256,
    context_length: int = 1024,
) -> Task:
    """GSM8K task: ``dataset=None`` is the packaged fixture, a .json/.jsonl path a local
    GSM8K-format file, anything else a hub dataset with a "main" config (e.g.
    ``"openai/gsm8k"``). ``n_queries`` keeps the first n problems. Reward: 1.0 when the
    extracted answer equals the gold number after ``####``, else 0.0.
    """
    name = "gsm8k"
    where = f"task {name!r}"
    dataset = dataset_name(dataset, where)
    split = checks.text(split, "split", where=where)
    if n_queries is not None:
        n_queries = checks.integer(n_queries, "n_queries", minimum=1, where=where)
    source, records = _load_records(dataset, split)
    queries = []
    for record in records:
        if not {"question", "answer"} <= set(record.data):
            raise checks.DataError(
                f"{source}, {record.place} needs 'question' and 'answer' fields; it has "
                f"{sorted(record.data)}"
            )
        question = text_field(record, "question", source).strip()
        if not question:
            raise checks.DataError(f"{source}, {record.place} has an empty question")
        try:
            gold = gold_answer(text_field(record, "answer", source))
        except ValueError as err:
            raise checks.DataError(f"{source}, {record.place}: {err}") from err
        queries.append(Query(text=question, answer=gold))
    count = select_count(name, len(queries), n_queries)
    return Task(
        name=name,
        queries=queries[:count],
        reward_fn=AnswerCheckReward(),
        prompt_fn=gsm8k_prompt,
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={"source": "packaged fixture" if dataset is None else dataset, "split": split},
    )
