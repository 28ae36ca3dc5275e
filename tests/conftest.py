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


SLOW = {
    # The tests of the second command, ``python -m pytest -m slow`` (README, "Quick start"),
    # besides those marked in their files (tests/test_sharding.py, test_distributed.py, the
    # vLLM engine's): each trains or plays for 8 s or more on 2 cores (its seconds measured
    # in a full run on a busy machine), or 24 s in all for its parameters (the textarena
    # one). The default run keeps a faster test of each module.
    "tests/test_cross_play.py::test_cross_play_writes_a_matrix_of_every_pairing",  # 281
    "tests/test_bridges.py::test_torchrl_trains_both_seats_beyond_chance",  # 111
    "tests/test_sweep.py::test_two_sweep_processes_split_a_grid",  # 79
    "tests/test_layers.py::test_the_guard_fails_on_every_kind_of_planted_import",  # 68 in all
    "tests/test_multi_turn.py::test_two_round_games_train_evaluate_and_resume",  # 67 in all
    "tests/test_bridges.py::test_sb3_ppo_observer_beats_random_beyond_chance",  # 66
    "tests/test_trackers.py::test_mlflow_gets_config_metrics_and_summary",  # 60
    "tests/test_ppo_agent.py::test_reward_rises_for_ppo_and_cory",  # 47 in all
    "tests/test_trackers.py::test_trackio_local_store_gets_metrics_and_summary",  # 34
    "tests/test_hh.py::test_hh_trains_from_the_command_line",  # 33
    "tests/test_eval_along.py::test_a_resumed_run_keeps_its_evaluations_and_pairs_with_its_base",
    "tests/test_sweep.py::test_committed_results_count_as_done_where_the_run_folders_are_gone",
    "tests/test_trackers.py::test_wandb_without_an_api_key_logs_offline_and_says_so",  # 26
    "tests/test_play.py::test_play_runs_interactively_as_a_command",  # 26
    "tests/test_sweep.py::test_interrupted_sweep_skips_finished_resumes_broken_restarts_empty",
    "tests/test_checkpoint.py::test_tensorboard_holds_each_iteration_once_after_a_crash_and_resume",
    "tests/test_dynamic_sampling.py::test_a_run_draws_more_batches_for_groups_that_differ",  # 18
    "tests/test_compare.py::test_matched_kl_reads_each_seed_s_trajectory",  # 15
    "tests/test_train.py::test_resume_continues_exactly_like_an_uninterrupted_run",  # 14
    "tests/test_learners.py::test_three_agent_chain_trains_and_rotates_roles",  # 13
    "tests/test_shared_seats.py::test_shared_cory_trains_resumes_and_is_one_agent",  # 13
    "tests/test_import_names.py::test_the_project_imports_beside_packages_named_agents_and_train",
    "tests/test_readme_api.py::test_the_api_names_come_in_any_order_and_leave_the_train_package_alone",
    "tests/test_paper_gsm8k.py::test_paper_gsm8k_trains_and_evaluates_on_a_tiny_model",  # 12
    "tests/test_multi_turn.py::test_dynamic_sampling_keeps_groups_of_one_query_and_turn",  # 11
    "tests/test_update_health.py::test_a_run_says_its_updates_were_unhealthy",  # 10
    "tests/test_learners.py::test_readme_learner_takes_a_seat_beside_ppo_and_resumes",  # 10
    "tests/test_compare.py::test_an_answer_checked_task_gets_pass_at_k_along_training",  # 9
    "tests/test_memory.py::test_a_run_logs_its_own_peak_not_the_process_s",  # 9
    "tests/test_compare.py::test_a_two_agent_checked_game_gets_the_observer_s_reference_use_along_training",
    "tests/test_compare.py::test_matched_kl_p_values_are_holm_adjusted_over_the_kls",  # 9
    "tests/test_compare.py::test_curves_and_frontier_files",  # 8
    "tests/test_learners.py::test_heterogeneous_seats_each_have_their_model_tokenizer_and_reference",
    # 4-12 s each, but their modules' logic has faster tests (tests/test_baselines.py trains
    # every learner through the run path; test_compare.py and test_textarena.py keep others):
    "tests/test_textarena.py::test_every_learner_takes_a_seat_whose_match_can_end_before_its_turn",
    "tests/test_compare.py::test_a_kl_outside_what_every_seed_reaches_is_said",  # 12
    "tests/test_compare.py::test_groups_on_different_evaluation_sets_get_no_query_bootstrap",  # 7
}
"""Test functions (every parameter of each) marked ``slow`` here, so that the files that
hold them need no edit; a name that no longer names a test of its file fails collection."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks
def pytest_collection_modifyitems(config, items):
    modules = {}
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        modules.setdefault(path, getattr(item, "module", None))
        if f"{path}::{rest.split('[')[0]}" in SLOW:
            item.add_marker(pytest.mark.slow)
    gone = [
        name
        for name in sorted(SLOW)
        if name.split("::")[0] in modules
        and not hasattr(modules[name.split("::")[0]], name.split("::")[1])
    ]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that are gone: {gone}")


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
    named = [v if isinstance(v, str) else dict(v or {}).get("learner") for v in seats.values()]
    if algorithm == "reinforce" or (seats and set(named) <= {"reinforce", *seats}):
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
