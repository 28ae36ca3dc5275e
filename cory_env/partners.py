"""Partners: a seat of the game played inside the environment by a fixed policy.

A single-policy trainer (TRL, an OpenEnv client) trains one seat; the other seats need
answers too. A partner is any callable ``partner(prompt_text) -> answer_text``;
:func:`model_partner` builds one from a transformers causal LM (a name, a local folder, the
embedded default, or an exported agent of a trained run: ``cory-export RUN OUT`` writes
``OUT/llm_0`` etc. as such folders).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cory_env.models import EMBEDDED, ensure_pad_token, load_causal_lm, load_tokenizer

Partner = Callable[[str], str]
"""A policy that answers a prompt text with an answer text."""


class ModelPartner:
    """A causal LM answering prompts: greedy by default (then answers are cached, so a
    prompt met again, as in a GRPO group, costs nothing), or sampled with ``seed``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 32,
        do_sample: bool = False,
        temperature: float = 1.0,
        seed: int | None = 0,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = ensure_pad_token(tokenizer)
        self.max_new_tokens = max_new_tokens
        self.do_sample = do_sample
        self.temperature = temperature
        self._generator_seed = seed
        self._cache: dict[str, str] = {}

    def __call__(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise TypeError(f"a partner answers a prompt text (str), got {type(prompt).__name__}")
        if not self.do_sample and prompt in self._cache:
            return self._cache[prompt]
        import torch

        if self.do_sample and self._generator_seed is not None:
            torch.manual_seed(self._generator_seed)
            self._generator_seed += 1  # the next answer differs, the sequence is fixed
        encoded = self.tokenizer(prompt, return_tensors="pt")
        if encoded["input_ids"].shape[1] == 0:  # an empty prompt: start from BOS (else EOS)
            start = self.tokenizer.bos_token_id
            start = self.tokenizer.eos_token_id if start is None else start
            encoded = {
                "input_ids": torch.tensor([[start]]),
                "attention_mask": torch.ones(1, 1, dtype=torch.long),
            }
        encoded = {k: v.to(self.model.device) for k, v in encoded.items()}
        sampling = {"temperature": self.temperature, "top_k": 0} if self.do_sample else {}
        with torch.no_grad():
            out = self.model.generate(
                **encoded,
                max_new_tokens=self.max_new_tokens,
                do_sample=self.do_sample,
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        new = out[0, encoded["input_ids"].shape[1] :]
        answer = self.tokenizer.decode(new, skip_special_tokens=True)
        if not self.do_sample:
            self._cache[prompt] = answer
        return answer


def model_partner(
    model: str | Path | Any = EMBEDDED,
    tokenizer: str | Path | Any | None = None,
    **options: Any,
) -> ModelPartner:
    """A partner from a causal LM: a model object, or a name/folder to load (``"embedded"``:
    the embedded default). ``tokenizer`` defaults to the model folder's. ``options``:
    ``max_new_tokens``, ``do_sample``, ``temperature``, ``seed`` (:class:`ModelPartner`)."""
    if isinstance(model, (str, Path)):
        folder = Path(model)
        if (folder / "config.yaml").is_file() and not (folder / "config.json").is_file():
            raise ValueError(
                f"{model} is a run folder, not a model: export its agents first "
                f"(cory-export {model} OUT) and give OUT/llm_0 (or another seat's folder)"
            )
        tokenizer = load_tokenizer(str(tokenizer if tokenizer is not None else model))
        model = load_causal_lm(str(model))
    elif tokenizer is None:
        raise ValueError("a model object needs its tokenizer: model_partner(model, tokenizer)")
    elif isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(str(tokenizer))
    return ModelPartner(model, tokenizer, **options)


def fixed_partner(answer: str) -> Partner:
    """A partner that always gives ``answer`` (for tests and baselines)."""

    def partner(prompt: str) -> str:
        return answer

    return partner
