"""The same seed twice is the same run, whether or not the run converted the embedded model.

A newcomer's first run converts the packaged GGUF into the cache; converting drew random
weights (overwritten at once) from torch's global generator after the run had seeded it,
so every later draw of the first run, and with them its KL, differed from the next run's.
"""

from __future__ import annotations

import pytest
import torch

from cory_env import models
from tests.conftest import read_jsonl, tiny_config

pytestmark = pytest.mark.slow  # converts the embedded 135M model (about a minute)


def numbers(rows: list[dict]) -> list[dict]:
    """Each row's metrics but its timings and memory, which vary from run to run."""
    skip = ("time/", "memory/")
    return [{k: v for k, v in row.items() if not k.startswith(skip)} for row in rows]


def run_embedded(run_dir) -> tuple[list[dict], bytes]:
    from cory_rl.train.training.run import run_training

    config = tiny_config(
        "embedded",
        run_dir,
        "cory",
        iterations=2,
        max_new_tokens=[2, 4],
        checkpoint_every=2,
        eval_every=0,
        learner={"ppo_epochs": 1, "mini_batch_size": 4, "gradient_accumulation_steps": 1},
    )
    run = run_training(config)
    return numbers(read_jsonl(run.path / "metrics.jsonl")), (
        run.path / "samples.jsonl"
    ).read_bytes()


def test_converting_the_embedded_model_draws_nothing_from_torch_s_generator(tmp_path, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    folder = models.embedded_model_dir()  # a cold cache: converted here
    assert (folder / "model.safetensors").is_file()
    assert torch.equal(before, torch.get_rng_state())


def test_a_run_that_converts_the_model_is_the_run_that_loads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "cache"))
    models.load_tokenizer.cache_clear()  # a tokenizer remembered by an earlier test: none
    cold = run_embedded(tmp_path / "cold")  # converts the model into the empty cache
    assert (tmp_path / "cache" / "smollm2-135m-instruct" / "model.safetensors").is_file()
    models.load_tokenizer.cache_clear()
    warm = run_embedded(tmp_path / "warm")  # loads it from the cache
    assert cold[0] == warm[0]  # every metric of every iteration, exactly
    assert cold[1] == warm[1]  # and every sample
    models.load_tokenizer.cache_clear()  # later tests: the usual cache
