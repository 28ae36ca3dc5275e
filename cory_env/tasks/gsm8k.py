"""GSM8K math word problems, the CORY paper's second task, scored by the answer checker.

Offline, a 40-problem fixture in GSM8K format written for this project is used;
with a hub, ``openai/gsm8k`` (config "main"); or any local GSM8K-format JSON(L) file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from cory_env.rewards import AnswerCheckReward
from cory_env.tasks import register_task
from cory_env.tasks._checks import positive_int, select_count
from cory_env.tasks.answer_check import gold_answer
from cory_env.tasks.base import Query, Task

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
    path = resources.files("cory_env") / "data" / FIXTURE_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _load_records(dataset: str, split: str) -> Any:
    try:
        import datasets

        if dataset.lower().endswith((".jsonl", ".json")):  # local file: single "train" split
            return datasets.load_dataset("json", data_files=dataset, split="train")
        return datasets.load_dataset(dataset, "main", split=split)
    except Exception as err:  # no hub, missing file, unknown config or split
        raise RuntimeError(
            f"gsm8k task: could not load dataset {dataset!r} (split {split!r}): {err}. "
            "Without a dataset hub, use dataset=None for the packaged GSM8K-format fixture, "
            "or give a local .jsonl file with 'question' and 'answer' fields."
        ) from err


def gsm8k_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """One-shot prompt; observers also see the latest earlier answer as a reference."""
    if role == 0:
        return f"{ONE_SHOT}Question: {query.text}\nAnswer:"
    if not earlier:
        raise ValueError(f"gsm8k prompt for role {role} needs an earlier response; got none")
    return f"{ONE_SHOT}Question: {query.text}\nReference: {earlier[-1].strip()}\nAnswer:"


@register_task("gsm8k")
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
    budget = max_new_tokens
    context_length = positive_int(name, "context_length", context_length)
    records = load_fixture() if dataset is None else _load_records(dataset, split)
    columns = set(records[0]) if dataset is None else set(records.column_names)
    if not {"question", "answer"} <= columns:
        raise ValueError(
            f"gsm8k task: dataset {dataset!r} needs 'question' and 'answer' fields; "
            f"it has {sorted(columns)}"
        )
    count = select_count(name, len(records), n_queries)
    queries = []
    for row in range(count):
        record = records[row]
        try:
            gold = gold_answer(str(record["answer"]))
        except ValueError as err:
            raise ValueError(f"gsm8k task: dataset {dataset!r}, row {row}: {err}") from err
        queries.append(Query(text=str(record["question"]).strip(), answer=gold))
    return Task(
        name=name,
        queries=queries,
        reward_fn=AnswerCheckReward(),
        prompt_fn=gsm8k_prompt,
        max_new_tokens=budget,
        context_length=context_length,
        metadata={"source": "packaged fixture" if dataset is None else dataset, "split": split},
    )
