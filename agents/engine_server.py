"""vLLM as a server: the rollout engine of ``agents/engine.py`` over HTTP, against a
``vllm serve`` process the user started (``vllm_mode: server``; TRL's ``vllm_mode``).

Generation goes through the OpenAI-compatible completions API, one request per game (its
own seed and token budget), sent together so that the server batches them: token-id
prompts, the sampling settings all spelled out (the server's own defaults never apply),
EOS as a stop token, the sampled tokens' ids and log-probs back. The server must be
started with ``--logprobs-mode processed_logprobs``, so that its log-probs are of the
distribution it sampled from, as the learner's ``sample_logprobs`` are; the engine checks
that, and the model it serves, before the first turn (``agents/engine_serve.py``'s
:func:`serve_command` is the command to start it).

After each update the server gets the new weights, as the in-process engine does, and
with the same ``hold``/``hold_adapter`` versioning, so that it never samples from the
weights before an update:

- full fine-tuning: the seat's weights are written as one safetensors file into a fresh
  folder, and the server reloads them from it in place (``reload_weights``, called
  through ``/collective_rpc``, which ``VLLM_SERVER_DEV_MODE=1`` opens; its prefix cache is
  then reset). TRL's ``trl vllm-serve`` sends weights over NCCL, which a CPU does not have;
  a file works on both. The server must see the trainer's temporary folder (the same
  machine, or ``TMPDIR`` on a shared filesystem).
- LoRA: only the adapter, a folder of a few MB loaded under a new name for each version
  (``/v1/load_lora_adapter``, opened by ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), the
  previous version unloaded. A new name per version also keeps cached prompts of the
  old adapter from being reused. The seats' base weights are sent once, before the first
  adapter, in case a full fine-tuning run left other weights on the server (reloading
  the server's own folder would not do: it leaves a tied output layer as it was).

With several training processes (``accelerate launch``) every process calls ``hold`` at
the same turn (the loop runs them in lock-step): each takes the seat's weights (a sharded
learner gathers them on every process), only the main process sends them, and every
process waits for the main one's word that the server took them (a broadcast, which also
carries a failure to every process) before it generates. One server serves one run: a
second run's pushes would replace the first one's weights.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from cory_env.checks import UserError
from cory_rl.agents.engine import Generation, SamplingSettings
from cory_rl.agents.engine_serve import serve_command

WAIT_NOTE_S = 30.0
"""How often a wait for a server that is not up yet says so."""


class ServerError(UserError, ConnectionError):
    """The vLLM server is down, too slow, serves another model or refused a request."""


class _Client:
    """JSON over HTTP to one server, every failure a one-line :class:`ServerError`."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.url, self.timeout = base_url.rstrip("/"), float(timeout)

    def call(self, path: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
        """(status, parsed JSON or text) of one request; an HTTP error status is returned,
        not raised; no answer (down, too slow) raises."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method or ("GET" if body is None else "POST"),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        except TimeoutError as err:
            raise self.slow(path) from err
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise self.slow(path) from err
            raise ServerError(
                f"no vLLM server answers at {self.url} ({err.reason}); start one (docs/"
                "learners.md, 'vLLM as a server') or point vllm_server_base_url (or "
                "vllm_server_host and vllm_server_port) at it"
            ) from None
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def slow(self, path: str) -> ServerError:
        return ServerError(
            f"the vLLM server at {self.url} did not answer {path} within {self.timeout:g} s "
            "(vllm_server_timeout); it may be overloaded or stuck: raise the timeout or "
            "restart it"
        )

    def ok(self, path: str, body: Any = None, what: str = "") -> Any:
        """The parsed answer of a request that must succeed."""
        status, answer = self.call(path, body)
        if status != 200:
            raise ServerError(
                f"the vLLM server at {self.url} refused {what or path} (HTTP {status}: "
                f"{_message(answer)})"
            )
        return answer


def _message(answer: Any) -> str:
    """The error message in a server's answer, on one line."""
    if isinstance(answer, dict):
        error = answer.get("error", answer.get("detail", answer))
        answer = error.get("message", error) if isinstance(error, dict) else error
    return " ".join(str(answer).split())[:300]


class VLLMServerEngine:
    """A running ``vllm serve`` of one base model that the seats of that model take turns
    on (module doc); the :class:`cory_rl.agents.engine.RolloutEngine` protocol."""

    def __init__(
        self,
        base_url: str,
        model: str,
        max_model_len: int,
        *,
        timeout: float = 240.0,
        lora_rank: int | None = None,
        base_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
        aliases: Iterable[str] = (),
        is_main: bool = True,
        share: Callable[[Any], Any] | None = None,
    ) -> None:
        """``model``: the folder (or hub id) the seats load; the server must serve it
        under that name, its resolved path or one of ``aliases``. ``base_weights()``: with
        LoRA, the base the adapters were made for (sent before the first adapter).
        ``share(value)`` returns the main process's ``value`` on every process (a
        broadcast, and so a barrier); None = one process."""
        if lora_rank is not None and base_weights is None:
            raise ValueError("a LoRA server engine needs base_weights, the adapters' base")
        self.client = _Client(base_url, timeout)
        self.url = self.client.url
        self.adapters = lora_rank is not None
        self.base_weights = base_weights
        self.is_main = is_main
        self.share = share or (lambda value: value)
        self.held: tuple[int, int] | None = None
        """(id of the owner, weights version) the server now samples from; None = not
        known (whatever an earlier run left there), so the first turn always sends."""
        self.reloads = 0
        self._folders = tempfile.TemporaryDirectory(prefix="cory-server-")
        self._folder: Path | None = None  # the full weights the server holds now
        self._adapters: dict[int, tuple[int, str, Path]] = {}  # owner -> version, name, folder
        self.model = self._check(model, max_model_len, lora_rank, aliases, timeout)
        self._tag = self.share(uuid.uuid4().hex[:8])  # adapter names of this run, every process
        self._serving = self.model  # the model name a request asks for (an adapter's)

    # ------------------------------------------------------------------ checks
    def _wait(self, timeout: float) -> None:
        """Until the server answers /health (it may still be loading), at most ``timeout``;
        a wait says what it waits for, and again every :data:`WAIT_NOTE_S` seconds."""
        start = time.monotonic()
        deadline, note_at = start + timeout, start
        while True:
            try:
                status, _ = self.client.call("/health")
                if status == 200:
                    return
                why = f"it answers /health with HTTP {status}"
            except ServerError as err:
                if time.monotonic() >= deadline:
                    raise
                why = "nothing answers there yet" if "no vLLM server" in str(err) else str(err)
            now = time.monotonic()
            if now >= deadline:
                raise ServerError(
                    f"the vLLM server at {self.url} did not become healthy within {timeout:g} s "
                    f"(vllm_server_timeout; {why})"
                )
            if now >= note_at and self.is_main:
                print(
                    f"waiting for the vLLM server at {self.url} ({why}): {now - start:.0f} s of "
                    f"at most {timeout:g} s (vllm_server_timeout)",
                    flush=True,
                )
                note_at = now + WAIT_NOTE_S
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0.01)))

    def _check(
        self,
        model: str,
        max_model_len: int,
        lora_rank: int | None,
        aliases: Iterable[str],
        timeout: float,
    ) -> str:
        """The served name of ``model``, after checking that the server can serve this
        engine: the same model, long enough, processed log-probs, dev mode, LoRA."""
        self._wait(timeout)
        served = [m for m in self.client.ok("/v1/models").get("data", []) if not m.get("parent")]
        names = {model, *aliases}
        names |= {str(Path(n).resolve()) for n in list(names) if Path(n).exists()}
        match = [m for m in served if {m.get("id"), m.get("root")} & names]
        hint = serve_command(model, max_model_len=max_model_len, lora_rank=lora_rank)
        if not match:
            found = ", ".join(repr(m.get("root") or m.get("id")) for m in served) or "nothing"
            raise ServerError(
                f"the vLLM server at {self.url} serves {found}, not the seats' model "
                f"{model!r}; start it with: {hint} (or --served-model-name {model})"
            )
        entry = match[0]
        if int(entry.get("max_model_len") or max_model_len) < max_model_len:
            raise ServerError(
                f"the vLLM server at {self.url} takes {entry['max_model_len']} tokens per "
                f"sequence; the game needs {max_model_len} (prompt + answer): restart it with "
                f"--max-model-len {max_model_len}"
            )
        status, info = self.client.call("/server_info?config_format=json")
        if status != 200:
            raise ServerError(
                f"the vLLM server at {self.url} has no dev endpoints (HTTP {status} on "
                "/server_info): start it with VLLM_SERVER_DEV_MODE=1, which weight updates "
                f"need: {hint}"
            )
        config = info.get("vllm_config", {}) if isinstance(info, dict) else {}
        mode = (config.get("model_config") or {}).get("logprobs_mode", "processed_logprobs")
        if mode != "processed_logprobs":
            raise ServerError(
                f"the vLLM server at {self.url} returns {mode}; the learner compares "
                "log-probs of the distribution sampled from: restart it with "
                "--logprobs-mode processed_logprobs"
            )
        if lora_rank is not None:
            self._check_lora(config.get("lora_config"), lora_rank, hint)
        return str(entry["id"])

    def _check_lora(self, lora: Any, rank: int, hint: str) -> None:
        if not lora:
            raise ServerError(
                f"the vLLM server at {self.url} takes no LoRA adapters; start it with: {hint}"
            )
        if int(lora.get("max_lora_rank") or rank) < rank:
            raise ServerError(
                f"the vLLM server at {self.url} takes LoRA ranks up to {lora['max_lora_rank']}, "
                f"the seats train rank {rank}: restart it with --max-lora-rank {rank}"
            )
        status, answer = self.client.call("/v1/unload_lora_adapter", {"lora_name": "cory-probe"})
        if status == 404 and _message(answer) == "Not Found":  # the route itself is missing
            raise ServerError(
                f"the vLLM server at {self.url} cannot load adapters at run time: start it "
                f"with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: {hint}"
            )

    # ------------------------------------------------------------------ weights
    def _everyone(self, push: Callable[[], None]) -> None:
        """``push`` on the main process; every process returns once it is done, and
        raises if it failed."""
        failure = None
        if self.is_main:
            try:
                push()
            except Exception as err:  # sent to every process, raised there
                failure = (
                    str(err) if isinstance(err, ServerError) else f"{type(err).__name__}: {err}"
                )
        failure = self.share(failure)
        if failure is not None:
            raise ServerError(failure)

    def hold(self, owner: object, version: int, weights: Callable[[], Iterable]) -> None:
        key = (id(owner), version)
        if self.held == key:
            return
        self._send(weights)
        self._serving = self.model
        self.held = key
        self.reloads += 1

    def _send(self, weights: Callable[[], Iterable]) -> None:
        """Whole weights to the server, through a file it reloads them from."""
        pairs = list(weights())  # every process: a sharded seat gathers its weights here
        folder = Path(self._folders.name) / f"weights-{self.reloads + 1}"

        def push() -> None:
            folder.mkdir(parents=True)
            save_file(_plain(pairs), folder / "model.safetensors")
            self.client.ok(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                "the new weights",
            )
            self.client.ok("/reset_prefix_cache", {}, "a prefix cache reset")
            if self._folder is not None:  # the server reads the new folder from now on
                shutil.rmtree(self._folder, ignore_errors=True)

        self._everyone(push)
        self._folder = folder

    def hold_adapter(self, owner: object, version: int, save: Callable[[Path], None]) -> None:
        known = self._adapters.get(id(owner))
        if known is None or known[0] != version:
            if not self._adapters and self.reloads == 0:
                self._send(self.base_weights)  # whatever an earlier run left on the server
            self.reloads += 1
            name = f"cory-{self._tag}-{self.reloads}"
            folder = Path(self._folders.name) / name
            save(folder)  # every process: a sharded seat gathers its adapter here

            def push() -> None:
                self.client.ok(
                    "/v1/load_lora_adapter",
                    {"lora_name": name, "lora_path": str(folder)},
                    "the seat's LoRA adapter",
                )
                if known is not None:  # that version is never asked for again
                    self.client.call("/v1/unload_lora_adapter", {"lora_name": known[1]})

            self._everyone(push)
            if known is not None:
                shutil.rmtree(known[2], ignore_errors=True)
            self._adapters[id(owner)] = (version, name, folder)
        self._serving = self._adapters[id(owner)][1]
        self.held = (id(owner), version)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: list[list[int]],
        budgets: list[int],
        sampling: SamplingSettings,
        seeds: list[int],
        eos_token_id: int,
    ) -> Generation:
        common = {
            "model": self._serving,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "top_p": sampling.top_p,
            "repetition_penalty": sampling.repetition_penalty,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "min_p": 0.0,
            "stop_token_ids": [int(eos_token_id)],
            "logprobs": 0,
            "return_token_ids": True,
        }
        bodies = [
            {
                **common,
                "prompt": [int(t) for t in prompt],
                "max_tokens": int(budget),
                "seed": int(seed),
            }
            for prompt, budget, seed in zip(prompts, budgets, seeds, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), 64))) as pool:
            answers = list(pool.map(self._complete, bodies))
        return Generation([a[0] for a in answers], [a[1] for a in answers])

    def _complete(self, body: dict[str, Any]) -> tuple[list[int], list[float]]:
        answer = self.client.ok("/v1/completions", body, "a completion")
        choice = answer["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        given = (choice.get("logprobs") or {}).get("token_logprobs") or []
        logprobs = [float("nan") if lp is None else float(lp) for lp in given]
        if len(logprobs) != len(tokens):
            raise ServerError(
                f"the vLLM server at {self.url} gave {len(logprobs)} log-probs for "
                f"{len(tokens)} tokens"
            )
        return tokens, logprobs


def _plain(pairs: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Named tensors safetensors can write: contiguous, on the CPU, none sharing memory
    with another (tied embeddings are written twice)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in pairs:
        tensor = tensor.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out
