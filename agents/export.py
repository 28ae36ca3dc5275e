"""Write a trained policy as a standard Hugging Face model folder that needs no code of ours.

``AutoModelForCausalLM.from_pretrained(folder)`` loads the result. Without LoRA the
folder is the fine-tuned model with its tokenizer; with LoRA it is the agent's adapter
(transformers loads the base named in ``adapter_config.json`` and applies it, with peft
installed), or, with ``merge=True``, the base with the adapter merged in. The value head,
which TRL's value-head models used to carry, is kept beside it as
``value_head.safetensors``: a linear layer on the last hidden state of the final layer.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from cory_rl.agents.policy import PolicyWithValue

VALUE_HEAD_FILE = "value_head.safetensors"


def export_policy(
    policy: PolicyWithValue,
    tokenizer: Any,
    out_dir: Path,
    merge: bool = False,
    info: dict[str, Any] | None = None,
) -> Path:
    """Save ``policy`` into ``out_dir`` (created; must not hold files already)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty; export into a new folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    lm = policy.lm
    if policy.adapter is None:
        lm.save_pretrained(out_dir, safe_serialization=True)
        kind = "full model"
    elif merge:
        merged = copy.deepcopy(lm).merge_and_unload(adapter_names=[policy.adapter])
        merged.save_pretrained(out_dir, safe_serialization=True)
        kind = "base with the LoRA adapter merged in"
    else:
        # peft writes an adapter not named "default" into a sub-folder of that name.
        with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
            lm.save_pretrained(tmp, selected_adapters=[policy.adapter])
            for item in (Path(tmp) / policy.adapter).iterdir():
                shutil.move(str(item), out_dir / item.name)
        kind = "LoRA adapter"
    tokenizer.save_pretrained(out_dir)
    head = policy.value_head
    save_file(
        {"weight": head.weight.detach().cpu().contiguous(), "bias": head.bias.detach().cpu()},
        str(out_dir / VALUE_HEAD_FILE),
        metadata={"input": "last hidden state of the final layer", "output": "V(s), a scalar"},
    )
    (out_dir / "cory_export.json").write_text(
        json.dumps({"contents": kind, "value_head": VALUE_HEAD_FILE, **(info or {})}, indent=1)
    )
    return out_dir
