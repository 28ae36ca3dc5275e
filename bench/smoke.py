"""``--smoke``: a bench at its smallest real setting, in seconds on a CPU.

A smoke run takes the same path as a real one (the same processes, loop, probes and
printed table) at the smallest sizes, on a tiny random Llama of the tests' size (2 layers
of width 32) with the project's character-level tokenizer
(``cory_env.small_vocab_tokenizer``), written to a temporary folder for the run. It shows
that a bench still runs end to end; its figures measure nothing. ``tests/test_bench_smoke.py``
runs every bench so.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cory_env import small_vocab_tokenizer

HELP = "the smallest real setting on a tiny random model, in seconds on a CPU (measures nothing)"


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, settings: Mapping[str, Any]
) -> argparse.Namespace:
    """Parse ``argv`` (default: the command line's) with a ``--smoke`` flag; with it,
    ``settings`` replace the parser's defaults (a flag given on the command line still wins).
    A ``model`` of None there stands for the tiny model (:func:`model_for`)."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**settings)
    return parser.parse_args(argv)


def write_tiny_model(folder: str, seed: int = 0) -> None:
    """A tiny random Llama and its character-level tokenizer, saved to ``folder``."""
    tokenizer = small_vocab_tokenizer("text")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,  # any task's context (gsm8k: 1024)
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@contextlib.contextmanager
def tiny_model() -> Iterator[str]:
    """The folder of a tiny model (:func:`write_tiny_model`), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-smoke-model-") as folder:
        write_tiny_model(folder)
        yield folder


@contextlib.contextmanager
def model_for(args: argparse.Namespace) -> Iterator[None]:
    """``args.model`` for the run: None (a smoke run's) becomes a tiny model's folder for
    as long as the run lasts; any other model is left as it is."""
    if args.model is not None:
        yield
        return
    with tiny_model() as folder:
        args.model = folder
        yield
