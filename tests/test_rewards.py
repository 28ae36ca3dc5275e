"""Reward functions: VADER, a tiny offline classifier, the answer checker, make_reward, a
user's own function."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from cory_env.query import Query
from cory_env.rewards import (
    DEFAULT_SENTIMENT_MODEL,
    AnswerCheckReward,
    ClassifierSentimentReward,
    VaderSentimentReward,
    make_reward,
)

WORDS = "this movie was great terrible good bad fun boring i loved hated it and the".split()


def _save_tiny_classifier(
    path: Path, id2label: dict[int, str], architecture: str = "distilbert"
) -> Path:
    """A randomly initialised 1-layer classifier and a word-level tokenizer, saved offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
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
    labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    torch.manual_seed(0)
    if architecture == "bert":
        config = BertConfig(
            vocab_size=len(vocab),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            pad_token_id=0,
            **labels,
        )
        model = BertForSequenceClassification(config).eval()
    else:
        config = DistilBertConfig(
            vocab_size=len(vocab),
            dim=16,
            hidden_dim=32,
            n_layers=1,
            n_heads=2,
            max_position_embeddings=16,
            pad_token_id=0,
            **labels,
        )
        model = DistilBertForSequenceClassification(config).eval()
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


def _logits(path: Path, texts: list[str]) -> torch.Tensor:
    """The saved model's own logits, one text at a time (no padding, no pipeline)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    rows = []
    for text in texts:
        inputs = tokenizer(text, return_tensors="pt", truncation=True)
        with torch.no_grad():
            rows.append(model(**inputs).logits[0])
    return torch.stack(rows)


@pytest.fixture(scope="module", params=["distilbert", "bert"])
def tiny_classifier(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp(f"tiny_{request.param}")
    return _save_tiny_classifier(path, {0: "NEGATIVE", 1: "POSITIVE"}, request.param)


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
    queries = [Query("this movie was"), Query("i"), Query("the"), Query("it was")]
    responses = [" great fun", " hated it and it was boring", " good", " bad bad bad"]
    reward = ClassifierSentimentReward(model=str(tiny_classifier), device="cpu", batch_size=3)
    assert reward._pipe is None  # nothing is loaded until the reward is needed
    scores = reward(queries, responses)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    texts = [q.text + r for q, r in zip(queries, responses, strict=True)]
    expected = _logits(tiny_classifier, texts)[:, 1].tolist()  # index of POSITIVE, raw logit
    for score, logit in zip(scores, expected, strict=True):
        assert math.isclose(score, logit, rel_tol=1e-4, abs_tol=1e-5)
    assert reward([], []) == []


def test_classifier_truncates_long_texts(tiny_classifier: Path) -> None:
    reward = ClassifierSentimentReward(model=str(tiny_classifier), device="cpu")
    long_response = " great" * 100  # far past the 16 positions of the tiny model
    (score,) = reward([Query("it was")], [long_response])
    expected = _logits(tiny_classifier, ["it was" + long_response])[0, 1].item()
    assert math.isclose(score, expected, rel_tol=1e-4, abs_tol=1e-5)


def test_classifier_label_lookup(tmp_path: Path) -> None:
    path = _save_tiny_classifier(tmp_path / "m", {0: "positive", 1: "negative"})
    reward = ClassifierSentimentReward(model=str(path), device="cpu")
    (score,) = reward([Query("it")], [" was good"])
    expected = _logits(path, ["it was good"])[0, 0].item()  # case-insensitive "POSITIVE"
    assert math.isclose(score, expected, rel_tol=1e-4, abs_tol=1e-5)
    wrong = ClassifierSentimentReward(model=str(path), positive_label="joy", device="cpu")
    with pytest.raises(ValueError, match=r"no label 'joy'; its labels are \[.*'negative'"):
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


USER_REWARD = """
def score(queries, responses):
    return [float(len(r)) for r in responses]
"""


def test_a_user_s_reward_file_loads_without_touching_sys_path(tmp_path, monkeypatch):
    """``path/file.py:function`` loads the file itself: ``sys.path`` is the same after, and
    the module is kept (once per process) under the file's stem."""
    monkeypatch.chdir(tmp_path)
    stem = f"own_reward_{tmp_path.name.replace('-', '_')}"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / f"{stem}.py").write_text(USER_REWARD)
    monkeypatch.delitem(sys.modules, stem, raising=False)
    before = list(sys.path)
    reward = make_reward(f"sub/{stem}.py:score")
    assert sys.path == before
    assert reward([Query("q"), Query("q")], ["ab", "abc"]) == [2.0, 3.0]
    assert sys.modules[stem].score is reward.fn
    assert make_reward(f"{tmp_path}/sub/{stem}.py:score").fn is reward.fn  # loaded once
    sys.modules.pop(stem)


def test_a_dotted_module_is_imported_as_python_finds_it(tmp_path, monkeypatch):
    """``package.module:function`` is found on Python's own path, which the reward leaves
    alone: a working folder's file not on it is refused, naming the file form."""
    stem = f"pkg_{tmp_path.name.replace('-', '_')}"
    (tmp_path / stem).mkdir()
    (tmp_path / stem / "__init__.py").write_text("")
    (tmp_path / stem / "rewards.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ValueError, match=rf"no module named '{stem}'.*{stem}/rewards\.py:score"):
        make_reward(f"{stem}.rewards:score")
    monkeypatch.syspath_prepend(str(tmp_path))  # as PYTHONPATH would
    before = list(sys.path)
    assert make_reward(f"{stem}.rewards:score")([Query("q")], ["abcd"]) == [4.0]
    assert sys.path == before
    for name in (stem, f"{stem}.rewards"):
        sys.modules.pop(name, None)


def test_a_reward_file_that_is_missing_or_clashes_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"no file 'nowhere\.py'"):
        make_reward("nowhere.py:score")
    (tmp_path / "json.py").write_text(USER_REWARD)
    with pytest.raises(ValueError, match=r"a module named 'json' is already imported.*rename"):
        make_reward("json.py:score")
    stem = f"needs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{stem}.py").write_text("import no_such_package_here\n" + USER_REWARD)
    with pytest.raises(ValueError, match=r"imports 'no_such_package_here', which is neither"):
        make_reward(f"{stem}.py:score")
    assert stem not in sys.modules  # a failed load leaves nothing behind


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
        ({"batch_size": True}, r"batch_size must be an integer >= 1, got True"),
        ({"positive_label": ""}, r"positive_label must be a non-empty string"),
        ({"model": None}, r"model must be a non-empty string, got None"),
    ],
)
def test_classifier_settings_validated(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClassifierSentimentReward(**settings)
