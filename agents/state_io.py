"""Checkpoint files that cannot run code: tensors as safetensors, everything else as JSON.

A pickle (``torch.load(weights_only=False)``) executes whatever a crafted file asks for,
so checkpoints never use one. Every reader here turns a missing, truncated or foreign
file into a :class:`CheckpointError` that names the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

_ALIASES = "cory.aliases"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or of a foreign format."""


def invalid(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a valid checkpoint file ({why}); this checkpoint cannot be resumed "
        "from. Resume from another run folder, or start a new run."
    )


def _replace_atomically(path: Path, write: Any) -> None:
    """Write to a sibling then rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".partial")
    write(tmp)
    os.replace(tmp, path)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Save named tensors; tensors that share storage (tied embeddings) are stored once."""
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
    _replace_atomically(Path(path), lambda tmp: save_file(unique, str(tmp), metadata=metadata))


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


def save_json(value: Any, path: Path) -> None:
    text = json.dumps(value, indent=1)
    _replace_atomically(Path(path), lambda tmp: Path(tmp).write_text(text))


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
