"""A learned reward model as a batched reward: the score of a sequence-classification model
with one output, given the conversation and the reply (Anthropic-HH's reward).

The model is checked when the reward is made (its config only: one line naming what to
download if it is not here) and loaded on the first batch, so building a task costs no
model load. ``pair`` inputs give the tokenizer the prompt and the reply as a text pair, as
OpenAssistant's DeBERTa reward models are trained; ``text`` inputs give it prompt + reply
as one text, as GPT-2 reward models trained on HH dialogues are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cory_env import checks
from cory_env.checks import RewardError
from cory_env.models import ensure_pad_token
from cory_env.query import Query

DEFAULT_HH_REWARD_MODEL = "OpenAssistant/reward-model-deberta-v3-large-v2"
"""Trained on human preference data that includes Anthropic-HH, one output, 435M
parameters: the reward model most HH fine-tuning studies score with (docs/tasks.md)."""
INPUT_FORMS = ("pair", "text")


class RewardModelScore:
    """``reward(queries, responses)``: the model's single logit for each (prompt, reply)."""

    def __init__(
        self,
        model: str = DEFAULT_HH_REWARD_MODEL,
        input_form: str = "pair",
        device: Any = None,
        batch_size: int = 16,
        max_length: int = 1024,
    ) -> None:
        where = "reward model"
        self.model_name = checks.text(model, "reward", where=where)
        self.input_form = checks.choice(input_form, "reward_input", INPUT_FORMS, where=where)
        self.batch_size = checks.integer(batch_size, "batch_size", minimum=1, where=where)
        self.max_length = checks.integer(max_length, "max_length", minimum=2, where=where)
        self.device = device
        self._loaded: tuple[Any, Any] | None = None
        self._check_config()

    def _missing(self, err: Exception) -> RewardError:
        return RewardError(
            f"reward model {self.model_name!r} is not here ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'}). Download it where a "
            f"hub is reachable (`hf download {self.model_name} --local-dir DIR`) and set "
            "task_settings reward: DIR, or give any sequence-classification model folder "
            "with one output"
        )

    def _check_config(self) -> None:
        """The model's config, read now: a missing model stops the run before any loads."""
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.model_name)
        except Exception as err:  # offline hub, bad path, not a model folder: one story
            raise self._missing(err) from None
        labels = getattr(config, "num_labels", None)
        if labels != 1:
            raise RewardError(
                f"reward model {self.model_name!r} has {labels} outputs; a reward model "
                "scores with one (num_labels 1)"
            )

    def _load(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            model = AutoModelForSequenceClassification.from_pretrained(self.model_name)
        except Exception as err:
            raise self._missing(err) from None
        ensure_pad_token(tokenizer)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        return tokenizer, model.to(self.device).eval()

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        import torch

        if len(queries) != len(responses):
            raise ValueError(f"{len(queries)} queries for {len(responses)} responses")
        if not responses:
            return []
        if self._loaded is None:
            self._loaded = self._load()
        tokenizer, model = self._loaded
        scores: list[float] = []
        for start in range(0, len(responses), self.batch_size):
            prompts = [q.text for q in queries[start : start + self.batch_size]]
            replies = list(responses[start : start + self.batch_size])
            if self.input_form == "pair":
                inputs = tokenizer(
                    prompts,
                    replies,
                    truncation="only_first",
                    padding=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
            else:  # one text; the prompt's start is cut if too long, so the reply stays
                tokenizer.truncation_side = "left"
                texts = [p + r for p, r in zip(prompts, replies, strict=True)]
                inputs = tokenizer(
                    texts,
                    truncation=True,
                    padding=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
            with torch.no_grad():
                logits = model(**inputs.to(self.device)).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
