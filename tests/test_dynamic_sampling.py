"""Dynamic sampling: groups whose rewards all match are dropped and more batches drawn,
by hand on rollouts and through training runs on a task whose rewards often all match."""

from __future__ import annotations

import sys

import pytest
import torch

from cory_env.checks import SettingError
from cory_rl.agents.dynamic_sampling import DynamicSampling
from cory_rl.agents.group import GRPOConfig
from cory_rl.agents.rollout import Rollout, concat_rollouts
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config, user_module


def rollout(rewards: list[float], width: int = 2, prompt: int = 3, start: int = 0) -> Rollout:
    """A rollout whose row i has tokens start+i (so rows can be told apart) and ``width``
    answer columns, the last one padding."""
    B = len(rewards)
    ids = torch.arange(start, start + B)[:, None]
    mask = torch.ones(B, width, dtype=torch.long)
    mask[:, -1] = 0
    return Rollout(
        prompt_ids=ids.expand(B, prompt).clone(),
        prompt_mask=torch.ones(B, prompt, dtype=torch.long),
        tokens=ids.expand(B, width).clone(),
        mask=mask,
        logprobs=-torch.ones(B, width) * mask,
        sample_logprobs=-torch.ones(B, width) * mask,
        values=torch.zeros(B, width),
        full_logprobs=torch.zeros(B, width, 5),
        rewards=torch.tensor(rewards),
    )


def test_groups_alike_are_dropped_and_the_batch_filled_from_more_draws():
    ds = DynamicSampling(group_size=2, max_extra_batches=4, pad_token_id=-1)
    first = ds.add(rollout([1.0, 1.0, 0.0, 1.0, 2.0, 2.0], start=0))  # group 1 differs
    assert ds.wants_more()
    assert first.tokens[:, 0].tolist()[:2] == [2, 3]  # kept first, then dropped fill in
    # the second batch is wider and its prompts longer: padded to one batch
    second = ds.add(rollout([0.0, 1.0, 3.0, 3.0, 1.0, 0.0], width=3, prompt=4, start=10))
    assert not ds.wants_more()
    assert second.tokens[:, 0].tolist() == [2, 3, 10, 11, 14, 15]
    assert second.tokens.shape == (6, 3) and second.prompt_ids.shape == (6, 4)
    assert second.mask[:2].tolist() == [[1, 0, 0], [1, 0, 0]]  # padding stays masked
    assert second.prompt_mask[:2, 0].tolist() == [0, 0] and second.prompt_ids[0, 0] == -1
    assert second.rewards.tolist() == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert ds.finish("grpo") == {
        "grpo/dynamic/kept_groups": 3.0,
        "grpo/dynamic/dropped_groups": 3.0,
        "grpo/dynamic/extra_batches": 1.0,
        "grpo/dynamic/filled_groups": 0.0,
    }
    assert ds.target is None  # the next iteration starts afresh


def test_a_batch_still_short_at_the_cap_is_filled_with_dropped_groups():
    ds = DynamicSampling(group_size=2, max_extra_batches=1, pad_token_id=0)
    ds.add(rollout([1.0, 1.0, 0.0, 1.0], start=0))
    assert ds.wants_more()
    batch = ds.add(rollout([5.0, 5.0, 4.0, 4.0], start=10))
    assert not ds.wants_more()  # the cap: one extra batch
    # the one group that differs, then the first dropped group: still 2 groups, 4 answers
    assert batch.tokens[:, 0].tolist() == [2, 3, 0, 1]
    assert ds.finish("rloo")["rloo/dynamic/filled_groups"] == 1.0


def test_one_rollout_is_its_own_concatenation():
    one = rollout([1.0, 0.0])
    assert concat_rollouts([one], 0) is one


def test_the_settings_are_checked():
    with pytest.raises(SettingError, match="max_extra_batches"):
        GRPOConfig(dynamic_sampling=True, max_extra_batches=-1).validate()
    with pytest.raises(SettingError, match="dynamic_sampling"):
        GRPOConfig(dynamic_sampling="on").validate()


# ---------------------------------------------------------------- through training runs

REWARD = '''
def parity(queries, responses):
    """1 for an answer of an odd number of characters: groups of 2 often match."""
    return [float(len(r) % 2) for r in responses]
'''


@pytest.fixture
def parity_task(tmp_path, monkeypatch):
    name = user_module(tmp_path, monkeypatch, "parity", REWARD)
    (tmp_path / "q.jsonl").write_text("".join(f'{{"prompt": "query {i}"}}\n' for i in range(20)))
    yield {"dataset": "q.jsonl", "reward": f"{name}.py:parity"}
    sys.modules.pop(name, None)


@pytest.mark.parametrize("learners", [None, {"llm_0": "grpo", "llm_1": "ppo"}])
def test_a_run_draws_more_batches_for_groups_that_differ(
    tiny_model_dir, tmp_path, parity_task, learners
):
    two = learners is not None
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        "grpo" if not two else "cory",
        iterations=3,
        task="custom",
        task_settings=parity_task,
        group_size=2,
        max_new_tokens=[1, 4],
        batch_size=8,
        learners=learners,
        learner={"dynamic_sampling": True, "max_extra_batches": 3, "mini_batch_size": 4},
    )
    rows = read_jsonl(run_training(config).path / "metrics.jsonl")
    kept = [r["llm_0/grpo/dynamic/kept_groups"] for r in rows]
    dropped = [r["llm_0/grpo/dynamic/dropped_groups"] for r in rows]
    extra = [r["llm_0/grpo/dynamic/extra_batches"] for r in rows]
    filled = [r["llm_0/grpo/dynamic/filled_groups"] for r in rows]
    assert sum(dropped) > 0 and sum(extra) > 0  # parity groups often match
    for k, d, e, f in zip(kept, dropped, extra, filled, strict=True):
        assert k + d == 4 * (1 + e)  # every group of every batch drawn is counted once
        assert (k >= 4 and f == 0) or (e == 3 and f == 4 - k)  # full, or filled at the cap
    # the batch trained on is exactly the batch's worth of groups: those differing first
    assert all(
        r["llm_0/grpo/frac_reward_zero_std"] == f / 4 for r, f in zip(rows, filled, strict=True)
    )
    if two:  # the PPO seat learns from the first batch of each iteration, 8 games
        assert all(r["llm_1/update/steps"] == 2 * 2 for r in rows)  # 2 epochs x 8 / 4
