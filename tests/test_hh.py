"""The Anthropic-HH task: conversations cut at the last assistant turn, a reward model's
score, one-line refusals offline, and a training run from the command line, all on a small
HH-format file and a small reward model built here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cory_env import checks
from cory_env.query import Query
from cory_env.reward_model import RewardModelScore
from cory_env.tasks import make_task
from cory_env.tasks.hh import ASSISTANT, conversation_prompt, hh_held_out, hh_prompt
from tests.conftest import make_tiny_tokenizer, tiny_flags

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["the movie", "the plot", "the ending", "the actors", "the story", "this film"]


def hh_records(n: int = 12) -> list[dict[str, str]]:
    records = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        talk = f"\n\nHuman: is {topic} good\n\nAssistant: yes it is\n\nHuman: why {i}"
        records.append(
            {"chosen": f"{talk}{ASSISTANT} it is fun", "rejected": f"{talk}{ASSISTANT} no"}
        )
    return records


@pytest.fixture()
def hh_file(tmp_path) -> Path:
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in hh_records()))
    return path


def save_reward_model(path: Path, num_labels: int = 1) -> Path:
    """A tiny GPT-2 sequence classifier with the tests' tokenizer, saved as a folder."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    tokenizer = make_tiny_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=256,
        num_labels=num_labels,
        pad_token_id=0,
    )
    GPT2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("reward-model"))


def test_a_query_is_the_conversation_up_to_its_last_assistant_turn():
    chosen = hh_records(1)[0]["chosen"]
    prompt = conversation_prompt(chosen)
    assert prompt.endswith(ASSISTANT) and prompt.count(ASSISTANT) == 2
    assert chosen.startswith(prompt) and chosen[len(prompt) :] == " it is fun"
    with pytest.raises(ValueError, match="no '\\\\n\\\\nAssistant:' turn"):
        conversation_prompt("\n\nHuman: hello")


def test_the_observer_sees_the_pioneer_reply_as_a_draft():
    query = Query(text=f"\n\nHuman: is it good{ASSISTANT}")
    assert hh_prompt(0, query, []) == query.text
    assert hh_prompt(1, query, [" yes "]) == (
        f"\n\nHuman: is it good\n\nA draft reply: yes{ASSISTANT}"
    )
    two = hh_prompt(2, query, ["a", "b"])
    assert two == f"\n\nHuman: is it good\n\nA draft reply: a\n\nA draft reply: b{ASSISTANT}"


def test_the_task_reads_an_hh_file_and_scores_with_the_reward_model(hh_file, reward_dir):
    task = make_task(
        "hh", dataset=str(hh_file), reward=str(reward_dir), reward_input="text", n_queries=5
    )
    assert len(task.queries) == 5 and all(q.text.endswith(ASSISTANT) for q in task.queries)
    scores = task.score(task.queries[:3], [" it is fun", " no", " great"])
    assert len(scores) == 3 and len(set(scores)) == 3  # a real model: the replies differ
    pair = RewardModelScore(str(reward_dir), "pair")
    assert len(pair(task.queries[:2], [" yes", " no"])) == 2
    # The same reply to the same conversation scores alike in a batch and alone.
    alone = task.score(task.queries[:1], [" it is fun"])
    assert alone[0] == pytest.approx(scores[0], abs=1e-5)


def test_a_local_file_has_one_split_and_the_hub_a_test_split(hh_file):
    assert not hh_held_out({"dataset": str(hh_file)}).held_out
    hub = hh_held_out({})
    assert hub.held_out and hub.settings["split"] == "test"


def test_offline_a_missing_dataset_or_reward_model_is_one_line_naming_the_download(
    hh_file, reward_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(checks.DataError) as err:
        make_task("hh", dataset="Anthropic/hh-rlhf", reward=str(reward_dir))
    assert "hf download Anthropic/hh-rlhf" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(checks.RewardError) as err:
        make_task("hh", dataset=str(hh_file), reward=str(tmp_path / "no-such-model"))
    assert "hf download" in str(err.value) and "task_settings reward" in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_hh_data_and_models_are_refused_by_name(tmp_path, hh_file):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: yo"})
        + "\n"
        + json.dumps({"question": "no"})
        + "\n"
    )
    with pytest.raises(checks.DataError, match="line 2 needs a 'chosen'"):
        make_task("hh", dataset=str(bad), reward="vader")
    no_turn = tmp_path / "no_turn.jsonl"
    no_turn.write_text(json.dumps({"chosen": "\n\nHuman: hi there"}) + "\n")
    with pytest.raises(checks.DataError, match="line 1: 'chosen': it has no"):
        make_task("hh", dataset=str(no_turn), reward="vader")
    with pytest.raises(checks.DataError, match="raise max_prompt_chars"):
        make_task("hh", dataset=str(hh_file), reward="vader", max_prompt_chars=10)
    with pytest.raises(checks.RewardError, match="2 outputs"):
        make_task(
            "hh",
            dataset=str(hh_file),
            reward=str(save_reward_model(tmp_path / "two", num_labels=2)),
        )
    with pytest.raises(checks.SettingError, match="no packaged data"):
        make_task("hh", dataset=None, reward="vader")


def test_hh_trains_from_the_command_line(hh_file, reward_dir, tiny_model_dir, tmp_path):
    settings = f"{{dataset: {hh_file}, reward: {reward_dir}, reward_input: text}}"
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train/cory.py"),
            *tiny_flags(
                tiny_model_dir,
                run,
                max_new_tokens="[2, 4]",
                task="hh",
                task_settings=settings,
                report_to="none",
                context_length=64,
            ),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(isinstance(r["llm_0/score"], float) for r in rows), rows[0].keys()


@pytest.mark.parametrize("algorithm", ["cory", "ppo", "elastic_reset", "reinforce"])
def test_paper_hh_runs_each_compared_algorithm_with_one_flag(algorithm):
    """The rebuttal's HH comparison: CORY, PPO, Elastic Reset, REINFORCE, one flag each."""
    from cory_rl.train.config.resolve import build_config

    config = build_config("paper-hh", algorithm=algorithm)
    assert (config.task, config.model, config.algorithm) == ("hh", "gpt2-large", algorithm)
    assert config.task_settings["dataset"] == "Anthropic/hh-rlhf"
    learner = config.learner
    assert learner["learning_rate"] == 1.41e-5 and learner["mini_batch_size"] == 256
    if algorithm == "elastic_reset":
        assert (learner["ema_decay"], learner["reset_freq"]) == (0.995, 17)
