"""Waiting for a vLLM server (``vllm_mode: server``) before any model loads, saying what for.

Why: a server that is not up yet may be loading its model (minutes), so the run waits up
to ``vllm_server_timeout``; but a port where every connection is refused has nothing
listening at all (vLLM binds its port before it loads the model), and waiting the whole
timeout for it only delays the one-line error. So the wait gives up after
:data:`REFUSED_LIMIT_S` of refusals in a row, unless a vLLM server of that port runs on
this machine (it may still be importing), and it says where it waits, why and how long,
every :data:`NOTE_EVERY_S`. Once something listens, the engine's own wait for ``/health``
(``agents/engine_server.py``) takes over.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from cory_env.checks import SettingError

REFUSED_LIMIT_S = 15.0
"""Refusals in a row for this long, with no vLLM server of the port here: nothing listens."""
NOTE_EVERY_S = 10.0
"""How often the wait says that it still waits."""
LOCAL_HOSTS = ("localhost", "0.0.0.0", "::1", "::")

START_HINT = (
    "start the server first (docs/learners.md, 'vLLM as a server': vllm serve MODEL --port "
    "PORT ...) and wait for its 'Application startup complete', or point "
    "vllm_server_base_url (or vllm_server_host and vllm_server_port) at a running one"
)


def host_port(url: str) -> tuple[str, int]:
    """The host and port of the server's address (http's 80 or https's 443 by default)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise SettingError(f"vllm_mode server: {url!r} has no valid port") from None
    if not parts.hostname:
        raise SettingError(f"vllm_mode server: {url!r} names no host; give http://HOST:PORT")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def connect(host: str, port: int, timeout: float) -> str | None:
    """None when something accepts a connection at ``host:port``; else why not, as
    ``"refused"`` or a short description."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "refused"
    except socket.gaierror as err:
        raise SettingError(
            f"vllm_mode server: the host {host!r} cannot be resolved ({err.strerror}); check "
            "vllm_server_host or vllm_server_base_url"
        ) from None
    except TimeoutError:
        return f"no answer to a connection within {timeout:g} s"
    except OSError as err:
        return err.strerror or type(err).__name__


def is_local(host: str) -> bool:
    return host in LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname()


def local_vllm_process(port: int) -> int | None:
    """The id of a process of this machine that serves vLLM on ``port``, if any (Linux)."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        words = raw.decode(errors="replace").split("\0")
        if int(entry.name) != os.getpid() and served_port(words) == port:
            return int(entry.name)
    return None


def served_port(words: list[str]) -> int | None:
    """The port a command line serves vLLM on (its ``--port``, else vLLM's 8000); None for
    a command that is no vLLM server (``vllm serve`` or ``python -m vllm.entrypoints...``)."""
    names = [Path(w).name for w in words]
    serve = any(a == "vllm" and b == "serve" for a, b in zip(names, names[1:], strict=False))
    if not serve and not any(w.startswith("vllm.entrypoints") for w in words):
        return None
    port = "8000"
    for flag, value in zip(words, words[1:], strict=False):
        port = value if flag == "--port" else port
    port = next((w.split("=", 1)[1] for w in words if w.startswith("--port=")), port)
    return int(port) if port.isdigit() else None


def wait_for_listener(
    url: str,
    timeout: float,
    *,
    say: Callable[[str], None] | None = print,
    find_server_process: Callable[[int], int | None] | None = None,
) -> None:
    """Return once something accepts connections at ``url``'s host and port; refuse in one
    line after ``timeout`` seconds, or sooner when connections stay refused and no vLLM
    process runs here. ``say`` prints the notes (None: silent, as on non-main processes);
    ``find_server_process`` is :func:`local_vllm_process` unless given."""
    find_server_process = find_server_process or local_vllm_process
    host, port = host_port(url)
    where = f"{host}:{port}"
    start = time.monotonic()
    refused_since: float | None = None
    note_at = start
    while True:
        now = time.monotonic()
        why = connect(host, port, timeout=max(min(2.0, start + timeout - now), 0.1))
        if why is None:
            return
        now = time.monotonic()
        keep_on, limit = "", ""
        if why == "refused":
            refused_since = now if refused_since is None else refused_since
            local = is_local(host)
            pid = find_server_process(port) if local else None
            if pid is not None:
                keep_on = f"; a vLLM server of this port (pid {pid}) runs here, maybe starting"
            elif now - refused_since >= REFUSED_LIMIT_S:
                none_here = ", and no vLLM server of this port runs here" if local else ""
                raise SettingError(
                    f"vllm_mode server: no vLLM server answers at {url}: nothing listens at "
                    f"{where} (every connection refused for {now - refused_since:.0f} s"
                    f"{none_here}); {START_HINT}"
                )
            why = f"nothing listens at {where} yet (connection refused)"
            limit = "" if keep_on else f", or {REFUSED_LIMIT_S:g} s of refusals in a row"
        else:
            refused_since = None
        if now - start >= timeout:
            raise SettingError(
                f"vllm_mode server: no vLLM server answers at {url} within {timeout:g} s "
                f"(vllm_server_timeout; {why}); {START_HINT}"
            )
        if say is not None and now >= note_at:
            say(
                f"waiting for the vLLM server at {url}: {why}{keep_on}; {now - start:.0f} s of "
                f"at most {timeout:g} s (vllm_server_timeout){limit}"
            )
            note_at = now + NOTE_EVERY_S
        time.sleep(min(1.0, max(start + timeout - time.monotonic(), 0.01)))
