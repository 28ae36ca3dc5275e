"""Shared fixtures: a tiny word-level tokenizer and tiny Llama models for fast tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast, not after retries

WORDS = (
    "<pad> <eos> the a movie film was is great good bad awful fun boring plot actors "
    "story ending love hate and but not very really i it this one two three four five "
    "six seven eight nine zero answer yes no"
).split()


def make_tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    return tok


def make_tiny_lm(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


def make_tiny_gpt2(vocab_size: int, seed: int = 0):
    """GPT-2 architecture (absolute positions), as in the paper's IMDB setting."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return GPT2LMHeadModel(config).eval()


class NoModel(AssertionError):
    pass


@pytest.fixture()
def no_model_load(monkeypatch):
    """Any attempt to load a model or a tokenizer fails the test: refusals must come first."""

    def refuse(*args, **kwargs):
        raise NoModel("a model was loaded before the error")

    monkeypatch.setattr("cory_rl.train.core.build.load_causal_lm", refuse)
    monkeypatch.setattr("cory_rl.train.core.build.load_tokenizer", refuse)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture()
def tiny_lm(tiny_tokenizer):
    return make_tiny_lm(len(tiny_tokenizer))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = make_tiny_tokenizer()
    make_tiny_lm(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tiny_config(model_dir, run_dir, algorithm="cory", **overrides):
    values = {
        "model": model_dir,
        "run_dir": str(run_dir),
        "batch_size": 4,
        "iterations": 3,
        "max_new_tokens": [2, 5],
        "role_exchange_period": 1,
        "checkpoint_every": 2,
        "sample_every": 1,
        "device": "cpu",
        "learner": {
            "mini_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "ppo_epochs": 2,
            "learning_rate": 1e-3,
        },
    }
    seats = overrides.get("learners") or {}
    if algorithm == "reinforce" or (seats and set(seats.values()) <= {"reinforce", *seats}):
        del values["learner"]["ppo_epochs"]  # one pass per rollout: it has no epochs setting
    learner = {**values["learner"], **overrides.pop("learner", {})}  # settings add up
    values.update(overrides, learner=learner)
    from cory_rl.train.config.resolve import build_config

    return build_config("smoke", overrides=values, algorithm=algorithm)


def tiny_flags(model_dir, run_dir=None, *, iterations=2, max_new_tokens="[2, 5]", **flags):
    """The command line of a tiny CPU run of the smoke preset on the tiny model, as many
    tests train: batches of 4, mini-batches of 2; ``flags`` add or replace settings
    (``task="custom"`` -> ``--task custom``)."""
    values = {
        "preset": "smoke",
        "model": str(model_dir),
        "device": "cpu",
        "batch_size": 4,
        "mini_batch_size": 2,
        "iterations": iterations,
        "max_new_tokens": max_new_tokens,
        **({} if run_dir is None else {"run_dir": str(run_dir)}),
        **flags,
    }
    return [part for name, value in values.items() for part in (f"--{name}", str(value))]


def load_script(path):
    """Import a script outside any package (bench/, examples/) as a module, once."""
    import importlib.util

    name = Path(path).stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def read_jsonl(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def user_module(tmp_path, monkeypatch, stem: str, source: str) -> str:
    """A file of the user's own in the working folder they run from (``tmp_path``, made the
    working folder); its stem, unique to the test, the module's name once loaded: pass
    ``{stem}.py:function``."""
    monkeypatch.chdir(tmp_path)
    name = f"{stem}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.delitem(sys.modules, name, raising=False)  # none left by an earlier test
    return name
