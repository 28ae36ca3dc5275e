"""A task from the command line: a user's data file and a reward named by text.

``--task custom --task_settings "{dataset: prompts.jsonl, prompt_column: prompt, reward:
my_rewards.py:score}"`` reads the queries from a local JSONL, JSON, CSV or Parquet file
through ``datasets``, and scores answers with ``reward``: a built-in name (``vader``,
``answer``), ``file.py:function``, ``module:function`` or ``http://HOST:PORT/PATH``
(``cory_env/user_rewards.py``).
Every 5th row is held out for evaluation (``split: test``), as for the packaged openings.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cory_env import checks
from cory_env.query import Query
from cory_env.rewards import make_reward
from cory_env.tasks.base import HeldOut, Task, select_count
from cory_env.tasks.files import json_records, read_local_text
from cory_env.tasks.registry import register_task

NAME = "custom"
WHERE = f"task {NAME!r}"
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SPLITS = ("train", "test", "all")
HELD_OUT_EVERY = 5
TEMPLATE_FIELDS = ("query", "answer", "answers")
"""``{query}``: the query; ``{answer}``: the latest earlier answer the role sees;
``{answers}``: all of them, each quoted, comma-separated."""


def load_rows(dataset: str, columns: Sequence[str]) -> list[dict[str, str]]:
    """``columns`` of every row of a local data file, each checked to be text (the first,
    the prompt, must be; later ones, answers, may be numbers the file's format parsed)."""
    path = Path(dataset)
    builder = BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise checks.SettingError(
            f"{WHERE}: dataset {dataset!r} must be a local {'/'.join(BUILDERS)} file "
            "(the formats datasets reads without a hub)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{WHERE}: dataset {dataset!r} does not exist")
    source = f"{WHERE}: {dataset!r}"
    if builder == "json":  # our reader names the line of a malformed record
        json_records(read_local_text(str(path), source), source)
    elif not path.read_bytes().strip():
        raise checks.DataError(f"{source} is empty")
    data = _load_quietly(builder, path, source)
    missing = [c for c in columns if c not in data.column_names]
    if missing:
        raise checks.DataError(
            f"{WHERE}: {dataset!r} has no column {missing[0]!r}; its columns are "
            f"{data.column_names} (set prompt_column / answer_column)"
        )
    rows = []
    for i, row in enumerate(data.select_columns(list(columns))):
        for column in columns[1:]:  # answers a CSV or Parquet file holds as numbers
            value = row[column]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[column] = str(value)
        for column in columns:
            if not isinstance(row[column], str) or not row[column].strip():
                raise checks.DataError(
                    f"{WHERE}: {dataset!r}, row {i}: {column!r} must be non-empty text, got "
                    f"{type(row[column]).__name__} {str(row[column])[:60]!r}"
                )
        rows.append(row)
    if not rows:
        raise checks.DataError(f"{WHERE}: {dataset!r} has no rows")
    return rows


def _load_quietly(builder: str, path: Path, source: str) -> Any:
    """The file through ``datasets``, without its progress bars and log lines (a file of a
    few rows), a failure in one line naming the file and the reason."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as err:  # a malformed file: its deepest reason, on one line
        while err.__cause__ is not None:
            err = err.__cause__
        reason = " ".join(str(err).split()) or type(err).__name__
        raise checks.DataError(f"{source}: datasets could not read it: {reason}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def check_template(template: str) -> str:
    """``template`` if it formats with the known fields only (else one clear error)."""
    checks.text(template, "observer_template", where=WHERE)
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as err:
        raise checks.SettingError(f"{WHERE}: observer_template {template!r}: {err}") from None
    unknown = sorted(fields - set(TEMPLATE_FIELDS))
    if unknown:
        raise checks.SettingError(
            f"{WHERE}: observer_template {template!r} has unknown field(s) {unknown}; "
            f"use {{query}}, {{answer}} (the latest earlier answer) or {{answers}}"
        )
    return template


def template_prompt(template: str | None, role: int, query: Query, earlier: Sequence[str]) -> str:
    """The query for the pioneer (and for every role without a template); the template,
    filled in, for later roles."""
    if role == 0 or template is None:
        return query.text
    quoted = ", ".join(f'"{a}"' for a in earlier)
    return template.format(query=query.text, answer=earlier[-1] if earlier else "", answers=quoted)


def custom_held_out(settings: dict[str, Any]) -> HeldOut:
    if settings.get("split", "train") == "all":
        return HeldOut(settings, "training drew from every row: nothing is held out", False)
    return HeldOut(
        {**settings, "split": "test"},
        f"every {HELD_OUT_EVERY}th row of {settings.get('dataset')}",
        True,
    )


@register_task(NAME, held_out=custom_held_out)
def make_custom_task(
    *,
    dataset: str | None = None,
    prompt_column: str = "prompt",
    answer_column: str | None = None,
    reward: str | None = None,
    reward_timeout: float = 60.0,
    observer_template: str | None = None,
    split: str = "train",
    n_queries: int | None = None,
    seed: int = 0,
    max_new_tokens: int | tuple[int, int] = 16,
    context_length: int = 256,
) -> Task:
    """Queries from column ``prompt_column`` of ``dataset`` (gold answers from
    ``answer_column``, for the ``answer`` reward or a user's), scored by ``reward``.

    ``split``: ``train`` (the default) leaves out every 5th row, which ``test`` holds;
    ``all`` keeps every row. ``observer_template`` is the later roles' prompt (None: the
    query alone), with ``{query}``, ``{answer}`` and ``{answers}``. ``reward_timeout``:
    seconds a reward server may take per batch. ``n_queries`` keeps a random subset.
    """
    if dataset is None:
        raise checks.SettingError(
            f'{WHERE} needs a dataset: --task_settings "{{dataset: prompts.jsonl, '
            'prompt_column: prompt, reward: my_rewards.py:score}"'
        )
    if reward is None:
        raise checks.SettingError(
            f"{WHERE} needs a reward: a built-in name (vader, answer), file.py:function or "
            "module:function (your batched (queries, responses) -> scores) or "
            "http://HOST:PORT/PATH"
        )
    dataset = checks.text(str(dataset), "dataset", where=WHERE)
    prompt_column = checks.text(prompt_column, "prompt_column", where=WHERE)
    if answer_column is not None:
        answer_column = checks.text(answer_column, "answer_column", where=WHERE)
    reward = checks.text(reward, "reward", where=WHERE)
    reward_timeout = checks.number(
        reward_timeout, "reward_timeout", minimum=0, exclusive_min=True, where=WHERE
    )
    if observer_template is not None:
        observer_template = check_template(observer_template)
    checks.choice(split, "split", SPLITS, where=WHERE)
    if n_queries is not None:
        n_queries = checks.integer(n_queries, "n_queries", minimum=1, where=WHERE)
    seed = checks.integer(seed, "seed", minimum=0, where=WHERE)
    reward_fn = make_reward(reward, timeout_s=reward_timeout)

    columns = [prompt_column] + ([answer_column] if answer_column else [])
    rows = load_rows(dataset, columns)
    if split != "all" and len(rows) < HELD_OUT_EVERY:
        raise checks.DataError(
            f"{WHERE}: {dataset!r} has {len(rows)} row(s); every {HELD_OUT_EVERY}th row is "
            f"held out for evaluation, so it needs at least {HELD_OUT_EVERY}. Add rows, or "
            "set split: all (nothing held out: evaluation then uses the training queries)"
        )
    if split != "all":
        held_out = split == "test"
        rows = [r for i, r in enumerate(rows) if ((i + 1) % HELD_OUT_EVERY == 0) == held_out]
        if not rows:
            raise checks.DataError(
                f"{WHERE}: {dataset!r} has too few rows for a {split!r} split (every "
                f"{HELD_OUT_EVERY}th row is held out); add rows or use split: all"
            )
    queries = [Query(r[prompt_column], r[answer_column] if answer_column else None) for r in rows]
    count = select_count(NAME, len(queries), n_queries)
    if count < len(queries):
        picked = np.random.default_rng(seed).choice(len(queries), size=count, replace=False)
        queries = [queries[i] for i in picked]
    return Task(
        name=NAME,
        queries=queries,
        reward_fn=reward_fn,
        prompt_fn=functools.partial(template_prompt, observer_template),
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={
            "source": dataset,
            "split": split,
            "reward": reward,
            "prompt_column": prompt_column,
            "answer_column": answer_column,
        },
    )
