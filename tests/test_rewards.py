"""Reward functions: VADER, a tiny offline classifier, the answer checker, make_reward."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cory_env.rewards import (
    DEFAULT_SENTIMENT_MODEL,
    AnswerCheckReward,
    ClassifierSentimentReward,
    VaderSentimentReward,
    make_reward,
)
from cory_env.tasks.base import Query

WORDS = "this movie was great terrible good bad fun boring i loved hated it and the".split()


def _save_tiny_classifier(path: Path, id2label: dict[int, str]) -> Path:
    """A randomly initialised 1-layer DistilBert classifier and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", model_max_length=16
    )
    config = DistilBertConfig(
        vocab_size=len(vocab),
        dim=16,
        hidden_dim=32,
        n_layers=1,
        n_heads=2,
        max_position_embeddings=16,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(config).eval()
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_distilbert")
    return _save_tiny_classifier(path, {0: "NEGATIVE", 1: "POSITIVE"})


def test_vader_scores_query_plus_response() -> None:
    reward = VaderSentimentReward()
    queries = [Query("The film was"), Query("The film was"), Query("I loved it."), Query("x")]
    responses = [" wonderful, a joy!", " awful and boring.", "", ""]
    scores = reward(queries, responses)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    assert scores[0] > 0.3 > -0.3 > scores[1]
    assert scores[2] > 0  # the query alone counts: the text scored is query + response
    assert scores[3] == 0.0


def test_rewards_check_batch_lengths() -> None:
    with pytest.raises(ValueError, match="2 queries but 1 responses"):
        VaderSentimentReward()([Query("a"), Query("b")], ["x"])
    with pytest.raises(ValueError, match="1 queries but 2 responses"):
        AnswerCheckReward()([Query("a", "1")], ["1", "2"])


def test_classifier_is_positive_logit_of_query_plus_response(tiny_classifier: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    queries = [Query("this movie was"), Query("i"), Query("the"), Query("it was")]
    responses = [" great fun", " hated it and it was boring", " good", " bad bad bad"]
    reward = ClassifierSentimentReward(model=str(tiny_classifier), device="cpu", batch_size=3)
    scores = reward(queries, responses)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)

    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).eval()
    for query, response, score in zip(queries, responses, scores, strict=True):
        ids = tokenizer(query.text + response, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = model(input_ids=ids).logits[0, 1].item()  # index of POSITIVE
        assert math.isclose(score, expected, rel_tol=1e-4, abs_tol=1e-5)


def test_classifier_truncates_long_texts(tiny_classifier: Path) -> None:
    reward = ClassifierSentimentReward(model=str(tiny_classifier), device="cpu")
    long_response = " great" * 100  # far past the 16 positions of the tiny model
    assert len(reward([Query("it was")], [long_response])) == 1


def test_classifier_label_lookup(tmp_path: Path) -> None:
    path = _save_tiny_classifier(tmp_path / "m", {0: "positive", 1: "negative"})
    reward = ClassifierSentimentReward(model=str(path), device="cpu")
    reward([Query("it")], [" was good"])
    assert reward._positive_index == 0  # case-insensitive match on "POSITIVE"
    wrong = ClassifierSentimentReward(model=str(path), positive_label="joy", device="cpu")
    with pytest.raises(ValueError, match="no label 'joy'.*negative"):
        wrong([Query("it")], [" was good"])


def test_classifier_load_failure_suggests_vader(tmp_path: Path) -> None:
    reward = ClassifierSentimentReward(model=str(tmp_path / "no_such_model"))
    with pytest.raises(RuntimeError, match="could not load.*no_such_model.*'vader'"):
        reward([Query("a")], ["b"])


def test_answer_check_reward() -> None:
    reward = AnswerCheckReward()
    queries = [Query("q1", "1200"), Query("q2", "-5"), Query("q3", "7")]
    scores = reward(queries, ["The answer is 1,200.", "It is -5", "The answer is 8."])
    assert scores == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="no gold answer"):
        reward([Query("no gold")], ["1"])


def test_make_reward() -> None:
    assert isinstance(make_reward("vader"), VaderSentimentReward)
    assert isinstance(make_reward("answer"), AnswerCheckReward)
    classifier = make_reward("classifier")
    assert isinstance(classifier, ClassifierSentimentReward)
    assert classifier.model_name == DEFAULT_SENTIMENT_MODEL
    custom = make_reward("someone/sentiment-model")
    assert isinstance(custom, ClassifierSentimentReward)
    assert custom.model_name == "someone/sentiment-model"

    def mine(queries, responses):
        return [0.0] * len(responses)

    assert make_reward(mine) is mine
    with pytest.raises(ValueError, match="unknown reward 'sentiment'.*vader.*classifier.*answer"):
        make_reward("sentiment")


def test_classifier_batch_size_validated() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ClassifierSentimentReward(batch_size=0)
