"""Checkpoint files that cannot run code: tensors as safetensors, everything else as JSON.

A pickle (``torch.load(weights_only=False)``) executes whatever a crafted file asks for,
so checkpoints never use one. Every reader here turns a missing, truncated or foreign
file into a :class:`CheckpointError` that names the file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from cory_env.checks import UserError

_ALIASES = "cory.aliases"
# safetensors' dtype names, in the order of its Dtype enum (which orders the data).
_DTYPE_NAMES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_DTYPE_RANK = {dtype: rank for rank, dtype in enumerate(_DTYPE_NAMES)}


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or of a foreign format."""


def invalid(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a valid checkpoint file ({why}); this checkpoint cannot be resumed "
        "from. Resume from another run folder, or start a new run."
    )


class WriteQueue(list):
    """File writes of :func:`save_tensors` and :func:`save_json` queued instead of done,
    to be run later in order (``for write in queue: write()``).

    What they save is taken at the call (JSON as text, tensors by reference), so a caller
    can run the queue in a background thread while the next rollout plays, as long as the
    saved tensors are not modified until it has finished (the loop waits before learning).
    A learner's ``save(path, writer=queue)`` hands its writes to the queue this way.
    """


def _replace_atomically(path: Path, write: Any, writer: WriteQueue | None) -> None:
    """Write to a sibling then rename, so a reader never sees half a file; with a
    ``writer``, the write is queued there instead."""

    def run() -> None:
        tmp = path.with_name(path.name + ".partial")
        write(tmp)
        os.replace(tmp, path)

    if writer is None:
        run()
    else:
        writer.append(run)


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
    """A safetensors file written straight from the tensors' memory.

    ``safetensors.torch.save_file`` first copies every tensor into a ``bytes`` object
    while holding the GIL; this writes each contiguous CPU tensor's buffer directly, so
    a checkpoint costs no extra memory and a background writer does not stall the loop.
    Layout as the library writes it: 8-byte header length, JSON header padded to 8 bytes,
    then the data by dtype, widest first so that every tensor stays aligned, then by name.
    """
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise TypeError(f"cannot save {name!r}: dtype {tensor.dtype} has no safetensors name")
    order = sorted(tensors, key=lambda name: (-_DTYPE_RANK[tensors[name].dtype], name))
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in order:
            if tensors[name].numel():
                f.write(tensors[name].reshape(-1).view(torch.uint8).numpy().data)


def save_tensors(
    tensors: dict[str, torch.Tensor], path: Path, writer: WriteQueue | None = None
) -> None:
    """Save named tensors, now or queued on ``writer``; tensors that share storage (tied
    embeddings) are stored once."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = tensor.contiguous().cpu()
    metadata = {_ALIASES: json.dumps(aliases)}
    _replace_atomically(Path(path), lambda tmp: write_safetensors(unique, tmp, metadata), writer)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read what :func:`save_tensors` wrote, aliases restored; a bad file is a CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise invalid(path, "the file is missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        aliases = json.loads(metadata.get(_ALIASES, "{}"))
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as err:
        raise invalid(path, f"not a readable safetensors file: {err}") from None
    for name, target in aliases.items():
        if target not in tensors:
            raise invalid(path, f"alias {name!r} points to a missing tensor {target!r}")
        tensors[name] = tensors[target]
    return tensors


def save_json(value: Any, path: Path, writer: WriteQueue | None = None) -> None:
    """``value`` as JSON, written atomically now or queued on ``writer``."""
    text = json.dumps(value, indent=1)
    _replace_atomically(Path(path), lambda tmp: Path(tmp).write_text(text), writer)


def load_json(path: Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise invalid(path, "the file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise invalid(path, f"not JSON: {err}") from None


def require(state: Any, keys: tuple[str, ...], path: Path) -> dict[str, Any]:
    """``state`` must be a mapping holding ``keys``; else the file is not a checkpoint."""
    if not isinstance(state, dict):
        raise invalid(path, f"expected a JSON object, found {type(state).__name__}")
    missing = [k for k in keys if k not in state]
    if missing:
        raise invalid(path, f"missing entries {missing}")
    return state


def split_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """A torch optimiser ``state_dict`` as (tensors, JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value
            else:
                plain.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "plain_state": plain}


def join_optimizer_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict:
    """Inverse of :func:`split_optimizer_state`."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for index, entry in rest.get("plain_state", {}).items():
        state.setdefault(int(index), {}).update(entry)
    return {"state": state, "param_groups": rest["param_groups"]}
