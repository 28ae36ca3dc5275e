"""Reading the tasks' local data files, so that a bad file is reported by name and line.

One loader for every task: text is decoded as UTF-8 (a file that is not says so, with the
line of the first bad byte), an empty file says it is empty, and JSON is read record by
record so that a malformed line is reported with its line number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cory_env import checks

JSON_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class Record:
    """One JSON record and where it came from (``"line 3"``; ``"record 3"`` in an array)."""

    place: str
    data: dict[str, Any]


def dataset_name(dataset: Any, where: str) -> str | None:
    """``dataset`` as a string (paths accepted), or None for the task's packaged data."""
    if dataset is None:
        return None
    if isinstance(dataset, os.PathLike):
        return os.fspath(dataset)
    return checks.text(dataset, "dataset", where=where, hint="None, a local file or a hub id")


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 text of a file's bytes (a byte-order mark is dropped); never empty."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise checks.DataError(
            f"{source} is not UTF-8 text: byte 0x{data[err.start]:02x} on line {line} cannot "
            "be decoded; save the file as UTF-8"
        ) from None
    if not text.strip():
        raise checks.DataError(f"{source} is empty")
    return text


def read_local_text(path: str, source: str, missing_hint: str = "") -> str:
    """The text of a local file, named ``source`` in messages (e.g. "task 'x': data.jsonl").

    A missing file is a FileNotFoundError that ends with ``missing_hint``.
    """
    file = Path(path)
    if not file.is_file():
        state = "is not a file" if file.exists() else "does not exist"
        raise FileNotFoundError(f"{source} {state}" + (f". {missing_hint}" if missing_hint else ""))
    return decode_text(file.read_bytes(), source)


def read_package_text(name: str, source: str = "") -> str:
    """The text of one of cory_env's data files (works from a wheel or a zip too)."""
    data = (resources.files("cory_env") / "data" / name).read_bytes()
    return decode_text(data, source or f"cory_env data file {name}")


def text_lines(text: str) -> list[str]:
    """Non-blank lines, stripped. Only ``\\n`` ends a line (not the separators in the text)."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def json_records(text: str, source: str) -> list[Record]:
    """The records of a JSON-lines text, or of one JSON array of objects.

    Every record must be a JSON object; a malformed line names the source and the line.
    """
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise checks.DataError(
                f"{source}, line {err.lineno}: not valid JSON ({err.msg}, column {err.colno})"
            ) from None
        pairs = [(f"record {i}", item) for i, item in enumerate(items)]
    else:
        pairs = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise checks.DataError(
                    f"{source}, line {number}: not valid JSON ({err.msg}, column {err.colno}): "
                    f"{line.strip()[:80]!r}"
                ) from None
            pairs.append((f"line {number}", item))
    records = []
    for place, item in pairs:
        if not isinstance(item, dict):
            raise checks.DataError(
                f"{source}, {place}: expected a JSON object (a record with named fields), "
                f"got {type(item).__name__} {str(item)[:60]!r}"
            )
        records.append(Record(place, item))
    if not records:
        raise checks.DataError(f"{source} has no records")
    return records


def text_field(record: Record, name: str, source: str) -> str:
    """The string field ``name`` of a record; missing or non-text fields name the place."""
    if name not in record.data:
        raise checks.DataError(
            f"{source}, {record.place} has no {name!r} field; its fields are {sorted(record.data)}"
        )
    value = record.data[name]
    if not isinstance(value, str):
        raise checks.DataError(
            f"{source}, {record.place}: {name!r} must be text, got {type(value).__name__} "
            f"{str(value)[:60]!r}"
        )
    return value


def dataset_records(
    task: str, dataset: str, split: str, offline_hint: str, config: str | None = None
) -> tuple[str, Iterator[Record]]:
    """(the source named in messages, its records in order) of a local JSON(L) file or a
    hub dataset (``config`` its configuration). A dataset that cannot be loaded (no hub,
    an unknown split) is one line that ends with ``offline_hint``."""
    if Path(dataset).suffix.lower() in JSON_SUFFIXES:  # a local file: read line by line
        source = f"task {task!r}: {dataset}"
        text = read_local_text(dataset, source, missing_hint=offline_hint)
        return source, iter(json_records(text, source))
    try:
        import datasets

        data = datasets.load_dataset(dataset, config, split=split)
    except Exception as err:  # no hub, unknown config or split: what to download instead
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise checks.DataError(
            f"task {task!r}: could not load dataset {dataset!r} (split {split!r}): {first}. "
            + offline_hint
        ) from None
    source = f"task {task!r}: dataset {dataset!r} (split {split!r})"
    return source, (Record(f"row {i}", dict(row)) for i, row in enumerate(data))
