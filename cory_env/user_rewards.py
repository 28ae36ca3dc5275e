"""Rewards a user names on the command line: a function of their own, or a reward server.

``path/to/file.py:function`` loads ``function`` from that file (relative to the working
folder), ``package.module:function`` imports it as Python finds modules (the installed
packages, ``PYTHONPATH``); neither changes ``sys.path``. ``http://HOST:PORT/PATH`` (or
https) is a server that scores a batch. Either gets the query texts and the responses (and,
when the queries have gold answers, ``answers``) and returns one score per response; the
task checks the scores as it checks every reward's (``cory_env/tasks/base.py``). Each is
tried on a few queries when its task is made (:func:`try_user_reward`), before any model
loads.

The server protocol: a POST of the JSON object ``{"queries": [...], "responses": [...]}``
(plus ``"answers"`` when there are any), answered by a JSON list of numbers or an object
whose ``"scores"`` is one. Only the standard library talks to it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from cory_env.checks import RewardError, RewardOutputError, SettingError, UserError
from cory_env.query import Query

FUNCTION_SPEC = re.compile(r"(?:[A-Za-z_][\w.]*|.+\.py):[A-Za-z_]\w*")
"""``package.module:function`` or ``path/to/file.py:function``."""
DEFAULT_TIMEOUT_S = 60.0
TRIAL_ANSWERS = ("", "a placeholder answer", "42")
"""The answers a user's reward is tried on before any model loads, one per query: an empty
one (what the game plays when an answer starts with EOS), some text, a number."""


ADDRESS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
"""Any ``scheme://``: a reward server's address (http and https are served)."""


def is_user_reward(spec: Any) -> bool:
    """Whether ``spec`` names a user's function or a reward server (not a built-in name)."""
    return isinstance(spec, str) and (
        ADDRESS.match(spec) is not None or FUNCTION_SPEC.fullmatch(spec) is not None
    )


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def user_reward(spec: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Callable[..., list[Any]]:
    """The reward ``spec`` names, as a batched ``reward_fn(queries, responses)``."""
    address = ADDRESS.match(spec)
    if address is not None and not is_url(spec):
        raise SettingError(
            f"reward {spec!r}: a reward server is reached over http:// or https://, not "
            f"{address.group(1)}://; serve it over HTTP (docs/tasks.md) and give its "
            "http://HOST:PORT/PATH"
        )
    return ServerReward(spec, timeout_s) if address is not None else FunctionReward(spec)


def _texts(queries: Sequence[Query]) -> tuple[list[str], dict[str, list[str]]]:
    """The query texts, and ``answers`` when every query has one."""
    answers = [q.answer for q in queries]
    extra = {"answers": answers} if answers and all(a is not None for a in answers) else {}
    return [q.text for q in queries], extra


class FunctionReward:
    """``package.module:function`` or ``path/to/file.py:function``, loaded once, called
    with texts."""

    def __init__(self, spec: str) -> None:
        module_name, _, attribute = spec.rpartition(":")
        self.spec = spec
        if module_name.endswith(".py"):
            module = _load_file(spec, Path(module_name))
        else:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                raise SettingError(
                    f"reward {spec!r}: no module named {err.name!r} among the installed "
                    "packages or on the Python path; give the file's path instead "
                    f"({module_name.replace('.', '/')}.py:{attribute}), or install it"
                ) from None
        fn = getattr(module, attribute, None)
        if fn is None:
            public = sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
            )
            raise SettingError(
                f"reward {spec!r}: module {module_name!r} has no {attribute!r}; its functions "
                f"are {public or 'none'}"
            )
        if not callable(fn):
            kind = type(fn).__name__
            raise SettingError(f"reward {spec!r}: {attribute!r} is a {kind}, not a function")
        self.fn = fn
        self.__qualname__ = spec  # how the task names it in messages

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> Any:
        texts, extra = _texts(queries)
        return self.fn(texts, list(responses), **extra)


def _load_file(spec: str, path: Path) -> ModuleType:
    """The module of the file ``path``, kept in ``sys.modules`` under the file's stem as an
    import keeps a module, so that it runs once per process; a stem that another module
    already holds is refused."""
    file = path.resolve()
    if not file.is_file():
        raise SettingError(
            f"reward {spec!r}: no file {str(path)!r} (from the working folder {Path.cwd()}); "
            "give the path of the Python file that defines the function"
        )
    name = file.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", None) or "").resolve() == file:
            return loaded
        raise SettingError(
            f"reward {spec!r}: a module named {name!r} is already imported (from "
            f"{getattr(loaded, '__file__', None) or 'the interpreter'}); rename {path.name}"
        )
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise SettingError(f"reward {spec!r}: {str(path)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # as an import does: its dataclasses and pickles look it up
    try:
        module_spec.loader.exec_module(module)
    except ModuleNotFoundError as err:
        del sys.modules[name]
        raise SettingError(
            f"reward {spec!r}: {path.name} imports {err.name!r}, which is neither installed "
            "nor on the Python path (the file's own folder is not searched); install it, or "
            "add its folder to PYTHONPATH"
        ) from None
    except BaseException:
        del sys.modules[name]
        raise
    return module


class ServerReward:
    """A reward server at ``url``, sent each batch as one JSON POST."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url, self.timeout_s = url, float(timeout_s)
        self.__qualname__ = url

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[Any]:
        texts, extra = _texts(queries)
        body = json.dumps({"queries": texts, "responses": list(responses), **extra}).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            detail = err.read()[:200].decode("utf-8", "replace")
            raise RewardError(
                f"reward server {self.url} answered HTTP {err.code} {err.reason}: {detail}"
            ) from None
        except TimeoutError:
            raise RewardError(
                f"reward server {self.url} did not answer within {self.timeout_s:g} s "
                f"(a batch of {len(texts)}); raise task_settings' reward_timeout or speed it up"
            ) from None
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise RewardError(
                    f"reward server {self.url} did not answer within {self.timeout_s:g} s; "
                    "raise task_settings' reward_timeout or speed it up"
                ) from None
            raise RewardError(
                f"reward server {self.url} cannot be reached ({err.reason}); start it, or "
                "check the host, port and path"
            ) from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise RewardOutputError(
                f"reward server {self.url} answered with something that is not JSON: "
                f'{raw[:80]!r}; it must answer a list of scores or {{"scores": [...]}}'
            ) from None
        scores = data.get("scores") if isinstance(data, dict) else data
        if not isinstance(scores, list):
            raise RewardOutputError(
                f"reward server {self.url} answered {str(data)[:80]}; it must answer a JSON "
                'list of scores or {"scores": [...]}'
            )
        return scores


def try_user_reward(task: Any) -> None:
    """Score a few of ``task``'s queries with :data:`TRIAL_ANSWERS` when its reward is a
    user's function or server, so that one that raises, is down, or returns the wrong
    count, type or non-finite scores is refused in seconds, not after the models load."""
    if not isinstance(task.reward_fn, (FunctionReward, ServerReward)):
        return
    queries = list(task.queries[: len(TRIAL_ANSWERS)])
    answers = list(TRIAL_ANSWERS[: len(queries)])
    try:
        task.score(queries, answers)
    except UserError as err:
        trial = (
            f" (a trial before any model loads: the first {len(queries)} queries with the "
            f"placeholder answers {answers}, as the game may play them)"
        )
        raise type(err)(f"{err}{trial}") from err.__cause__
