"""A common prompt beginning run once gives the full forward's logits, values, reference
logits and gradients (``agents/prefix.py``), on Llama- and GPT-2-shaped models."""

from __future__ import annotations

import pytest
import torch

from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.prefix import shared_prefix
from tests.conftest import make_tiny_gpt2, make_tiny_lm

VOCAB, SHARED, T = 50, 12, 3


def batch(own_lengths: list[int], shared: int = SHARED, seed: int = 0):
    """Left-padded rows: ``shared`` common tokens, then each row's own prompt tokens, then
    T response columns (the last row's response ends early: right padding)."""
    gen = torch.Generator().manual_seed(seed)
    common = torch.randint(2, VOCAB, (shared,), generator=gen)
    width = shared + max(own_lengths)
    rows, masks = [], []
    for i, own in enumerate(own_lengths):
        prompt = torch.cat([common, torch.randint(2, VOCAB, (own,), generator=gen)])
        response = torch.randint(2, VOCAB, (T,), generator=gen)
        pad = width - len(prompt)
        response_mask = torch.ones(T, dtype=torch.long)
        if i == len(own_lengths) - 1:
            response_mask[-1] = 0
        rows.append(torch.cat([torch.zeros(pad, dtype=torch.long), prompt, response]))
        masks.append(
            torch.cat(
                [torch.zeros(pad, dtype=torch.long), torch.ones(len(prompt)), response_mask]
            ).long()
        )
    ids, mask = torch.stack(rows), torch.stack(masks)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("make_model", [make_tiny_lm, make_tiny_gpt2])
def test_sharing_gives_the_full_forward_and_its_gradients(make_model):
    ids, mask, pos = batch([1, 4, 2, 6])
    torch.manual_seed(0)
    policy = PolicyWithValue(make_model(VOCAB))
    weights = torch.randn(4, T + 1, VOCAB)

    def run(share: bool):
        policy.zero_grad(set_to_none=True)
        logits, values, _ = policy(ids, mask, pos, keep=T + 1, share_prefix=share)
        ((logits * weights).sum() + values.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        return logits.detach(), values.detach(), grads

    full, shared = run(False), run(True)
    torch.testing.assert_close(shared[0], full[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(shared[1], full[1], atol=1e-5, rtol=1e-4)
    assert shared[2].keys() == full[2].keys()
    for name, grad in full[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5, rtol=1e-4, msg=name)

    reference = Reference(make_model(VOCAB))
    torch.testing.assert_close(
        reference.logits(ids, mask, pos, keep=T + 1, share_prefix=True),
        reference.logits(ids, mask, pos, keep=T + 1),
        atol=1e-5,
        rtol=1e-4,
    )


def test_the_shared_part_is_found_and_the_rest_masked():
    ids, mask, pos = batch([1, 4, 2, 6])
    split = shared_prefix(ids, mask, pos, keep=T + 1)
    assert split is not None and split.ids.shape == (1, SHARED)
    assert split.positions.tolist() == [list(range(SHARED))]
    assert split.rest_ids.shape == (4, 6 + T)  # after the shared part of the longest row
    # Each row attends to the shared part and to its own tokens after it, nothing else.
    own = split.rest_attention[:, SHARED:].sum(dim=1)
    assert own.tolist() == [1 + T, 4 + T, 2 + T, 6 + T - 1]
    assert split.rest_attention[:, :SHARED].all()
    # The rows' own tokens keep their positions: the first follows the shared part.
    for row in range(4):
        first_own = split.rest_attention[row, SHARED:].nonzero()[0]
        assert int(split.rest_positions[row, first_own]) == SHARED


def test_too_little_in_common_is_not_shared():
    ids, mask, pos = batch([1, 4], shared=5)
    assert shared_prefix(ids, mask, pos, keep=T + 1) is None  # fewer than 8 tokens
    ids, mask, pos = batch([3, 3])
    assert shared_prefix(ids[:1], mask[:1], pos[:1], keep=T + 1) is None  # one row
    # The shared part never reaches the prompt's last token, whose logits are wanted.
    ids, mask, pos = batch([0, 0], shared=10)
    split = shared_prefix(ids, mask, pos, keep=T + 1)
    assert split is not None and split.ids.shape[1] == 10 - 1


def test_a_few_shot_run_shares_its_examples_and_logs_the_same_metrics(
    tiny_model_dir, tmp_path, monkeypatch
):
    """CORY on arith with 4 worked examples: with share_prompt_prefix every forward of the
    update and of the reference runs the examples once, and the run logs what it logs
    without (within the tolerance of tests/test_same_metrics.py)."""
    import math

    from cory_rl.agents import policy as policy_module
    from cory_rl.train.training.run import run_training
    from tests.conftest import read_jsonl, tiny_config

    shared_lengths = []
    find = policy_module.shared_prefix

    def spy(*args, **kwargs):
        split = find(*args, **kwargs)
        if len(args[0]) > 1:  # micro-batches of one row have nothing to share
            shared_lengths.append(0 if split is None else split.ids.shape[1])
        return split

    monkeypatch.setattr(policy_module, "shared_prefix", spy)

    def run(share: bool, name: str) -> list[dict]:
        config = tiny_config(
            tiny_model_dir,
            tmp_path / name,
            "cory",
            task="arith",
            task_settings={"style": "equation", "shots": 4, "observer_prompt": "reference"},
            batch_size=8,
            iterations=2,
            max_new_tokens=[2, 4],
            learner={
                "mini_batch_size": 4,
                "gradient_accumulation_steps": 1,
                "forward_batch_size": 3,
                "share_prompt_prefix": share,
            },
        )
        return read_jsonl(run_training(config).path / "metrics.jsonl")

    without = run(False, "without")
    assert shared_lengths == []
    with_sharing = run(True, "with")
    assert shared_lengths and min(shared_lengths) >= 8  # each forward of rows shared
    compared = 0
    for row, old in zip(with_sharing, without, strict=True):
        for key, value in old.items():
            if isinstance(value, (int, float)) and not key.startswith(("time/", "memory/")):
                assert math.isclose(row[key], value, rel_tol=1e-4, abs_tol=1e-5), key
                compared += 1
    assert compared > 50


def test_sharded_policies_refuse_it_in_one_line():
    from cory_env.checks import SettingError
    from cory_rl.agents.ppo import PPOAgent, PPOConfig

    policy = PolicyWithValue(make_tiny_lm(VOCAB))
    policy.sharding = object()  # as the model pool marks a policy FSDP2 shards
    with pytest.raises(SettingError, match="share_prompt_prefix .* sharding none"):
        PPOAgent(policy, Reference(make_tiny_lm(VOCAB)), PPOConfig(share_prompt_prefix=True), 0)
    with pytest.raises(SettingError, match="share_prompt_prefix"):
        PPOConfig(share_prompt_prefix="yes").validate()
