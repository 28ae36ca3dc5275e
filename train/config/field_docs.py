"""The documentation of a settings dataclass's fields, read from its source.

A field is documented by the string literal under it (an attribute docstring, as in TRL's
and Hugging Face's config classes), or, for classes that document their fields in a list,
by a ``- ``name``: text`` item of the class docstring. That one text is the field's
``--help`` line (``cory_rl.train.commands.train_flags``), its documentation and what its
checks refer to. A leaf: it imports nothing of the project.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
from typing import Any

_ITEM = re.compile(r"^- ((?:``\w+``(?:, | and )?)+):\s*(.*)$")
"""A field item of a class docstring: ``- ``name``: text`` (or several names, comma-joined)."""
_ROLE = re.compile(r":\w+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]*)``")
_NOT_AN_END = ("e.g", "i.e", "etc", "vs", "cf", "Dr", "Mr", "al", "approx")
"""Words a dot follows without ending a sentence."""


def _own_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings written in ``cls``'s own body (not its bases')."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source: built in, or made at run time
        return {}
    tree = ast.parse(source)
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _listed_docs(cls: type) -> dict[str, str]:
    """Fields documented in the class docstring's list, ``- ``name``: text`` per item."""
    docs: dict[str, str] = {}
    names: list[str] = []
    for line in inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines():
        item = _ITEM.match(line.strip())
        if item:
            names = _LITERAL.findall(item.group(1))
            for name in names:
                docs[name] = item.group(2)
        elif names and line.startswith(" ") and line.strip():
            for name in names:
                docs[name] += " " + line.strip()
        else:
            names = []
    return docs


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Every field's documentation, its own class's first (a subclass's docstring of a
    field wins over its base's); a field with none is left out."""
    docs: dict[str, str] = {}
    for owner in reversed(cls.__mro__):
        if owner is not object:
            docs.update(_listed_docs(owner))
            docs.update(_own_docs(owner))
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    return {k: v for k, v in docs.items() if fields is None or k in fields}


def plain(text: str) -> str:
    """Documentation as plain text on one line: ``code`` and :role:`names` unmarked."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return " ".join(_LITERAL.sub(r"\1", text).split())


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` as plain text (a dot after ``e.g`` or inside a number
    or a file name ends none)."""
    text = plain(text)
    for match in re.finditer(r"\.(?=\s|$)", text):
        before = text[: match.start()]
        words = before.split()
        if words and words[-1].lstrip("(") in _NOT_AN_END:
            continue
        if before.count("(") > before.count(")"):  # inside a parenthesis
            continue
        return before + "."
    return text


def show_default(value: Any) -> str:
    """A default as a flag or a YAML file would write it."""
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_default(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show_default(v)}" for k, v in value.items()) + "}"
    return repr(value)


def field_help(cls: type, name: str, default: Any = dataclasses.MISSING) -> str:
    """A field's ``--help`` line: its documentation's first sentence and its default
    (``default``, else the field's own); only the default where it has no documentation."""
    if default is dataclasses.MISSING:
        default = field_default(cls, name)
    return help_line(field_docs(cls).get(name, ""), default)


def help_line(doc: str, default: Any = dataclasses.MISSING) -> str:
    """The first sentence of ``doc`` and ``(default: ...)``, on one line."""
    shown = "" if default is dataclasses.MISSING else f"(default: {show_default(default)})"
    return " ".join(part for part in (first_sentence(doc), shown) if part)


def field_default(cls: type, name: str) -> Any:
    """A dataclass field's default (its factory's value), or ``dataclasses.MISSING``."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING
