"""Batched reward functions: ``reward_fn(queries, responses) -> one float per response``.

The sentiment rewards score ``query.text + response`` as the CORY paper does (the
observer is scored on the raw query, never on its prompt). Nothing here downloads
anything at import time: the classifier is loaded on its first call, so the offline
default (VADER) works on machines with no model hub.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: importing cory_env.tasks here would be circular
    from cory_env.tasks.base import Query

DEFAULT_SENTIMENT_MODEL = "lvwerra/distilbert-imdb"
REWARD_NAMES = ("vader", "classifier", "answer")


def _check_batch(queries: Sequence[Query], responses: Sequence[str]) -> None:
    if len(queries) != len(responses):
        raise ValueError(
            f"reward got {len(queries)} queries but {len(responses)} responses; "
            "give one query per response"
        )


class VaderSentimentReward:
    """VADER compound score in [-1, 1]: a sentiment reward that needs no model download."""

    def __init__(self) -> None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError as err:
            raise ImportError(
                "the 'vader' reward needs the vaderSentiment package: pip install vaderSentiment"
            ) from err
        self._analyzer = SentimentIntensityAnalyzer()

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        _check_batch(queries, responses)
        return [
            float(self._analyzer.polarity_scores(q.text + r)["compound"])
            for q, r in zip(queries, responses, strict=True)
        ]


class ClassifierSentimentReward:
    """Positive-class logit of a Hugging Face text classifier (the paper's IMDB reward).

    The model is loaded lazily on the first call so that building a task costs
    nothing and a missing hub only fails when the reward is actually needed.
    """

    def __init__(
        self,
        model: str = DEFAULT_SENTIMENT_MODEL,
        positive_label: str = "POSITIVE",
        device: str | None = None,
        batch_size: int = 64,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.model_name = model
        self.positive_label = positive_label
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._tokenizer: Any = None
        self._positive_index: int | None = None
        self._max_length: int | None = None
        self._input_names: list[str] = []

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            model = AutoModelForSequenceClassification.from_pretrained(self.model_name)
        except Exception as err:  # hub unreachable, bad path, bad config: all one story
            raise RuntimeError(
                f"could not load the sentiment classifier {self.model_name!r} ({err}). "
                "Without a model hub, give a local model directory, or use the offline "
                "default reward 'vader' (reward='vader')."
            ) from err
        id2label = getattr(model.config, "id2label", None) or {}
        wanted = self.positive_label.lower()
        matches = [int(i) for i, label in id2label.items() if str(label).lower() == wanted]
        if not matches:
            raise ValueError(
                f"classifier {self.model_name!r} has no label {self.positive_label!r}; "
                f"its labels are {dict(id2label)}. Pass positive_label= one of them."
            )
        if tokenizer.pad_token is None:  # GPT-2 style classifiers have no pad token
            tokenizer.pad_token = tokenizer.eos_token
        limits = [
            n
            for n in (
                getattr(tokenizer, "model_max_length", None),
                getattr(model.config, "max_position_embeddings", None),
            )
            if isinstance(n, int) and 0 < n < 1_000_000
        ]
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        accepted = inspect.signature(model.forward).parameters
        self._input_names = [
            n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted
        ]
        self._model = model.to(device).eval()
        self._tokenizer = tokenizer
        self._positive_index = matches[0]
        self._max_length = min(limits) if limits else None
        self.device = device

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        _check_batch(queries, responses)
        if self._model is None:
            self._load()
        import torch

        texts = [q.text + r for q, r in zip(queries, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self._tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=self._max_length is not None,
                max_length=self._max_length,
                return_tensors="pt",
            )
            inputs = {k: v.to(self.device) for k, v in batch.items() if k in self._input_names}
            with torch.no_grad():
                logits = self._model(**inputs).logits
            scores.extend(logits[:, self._positive_index].float().cpu().tolist())
        return scores


class AnswerCheckReward:
    """1.0 when the number extracted from the response equals ``query.answer``, else 0.0."""

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        # Imported here, not at module top: cory_env.tasks imports this module.
        from cory_env.tasks.answer_check import score_answers

        _check_batch(queries, responses)
        golds = []
        for row, query in enumerate(queries):
            if query.answer is None:
                raise ValueError(
                    f"answer reward: query {row} ({query.text[:60]!r}) has no gold answer"
                )
            golds.append(query.answer)
        return score_answers(responses, golds)


RewardCallable = Callable[[Sequence["Query"], Sequence[str]], Sequence[float]]


def make_reward(name_or_callable: str | RewardCallable) -> RewardCallable:
    """A reward from a short name, a classifier id/path (contains "/"), or a callable."""
    if callable(name_or_callable):
        return name_or_callable
    name = name_or_callable
    if name == "vader":
        return VaderSentimentReward()
    if name == "classifier":
        return ClassifierSentimentReward()
    if name == "answer":
        return AnswerCheckReward()
    if isinstance(name, str) and "/" in name:
        return ClassifierSentimentReward(model=name)
    raise ValueError(
        f"unknown reward {name!r}; use one of {list(REWARD_NAMES)}, a Hugging Face "
        "classifier id or local path containing '/', or a callable "
        "reward_fn(queries, responses) -> scores"
    )
