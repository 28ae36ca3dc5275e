"""agents/sharding.py's state helpers in one plain process, on the tiny model: the logic the
FSDP2 tests (tests/test_sharding.py, slow: processes launched) rely on, in the default run.
Unsharded tensors pass through whole; names and shapes are checked before a copy."""

from __future__ import annotations

import pytest
import torch

from cory_rl.agents import sharding
from tests.conftest import make_tiny_lm


def test_blocks_are_the_decoder_layers_outermost_only(tiny_tokenizer) -> None:
    model = make_tiny_lm(len(tiny_tokenizer))
    found = sharding.blocks(torch.nn.ModuleList([model]))
    assert [type(b).__name__ for b in found] == ["LlamaDecoderLayer"] * 2
    assert sharding.blocks(torch.nn.Linear(2, 2)) == []


def test_whole_state_round_trips_and_refuses_other_names_or_shapes(tiny_tokenizer) -> None:
    source, target = make_tiny_lm(len(tiny_tokenizer), 0), make_tiny_lm(len(tiny_tokenizer), 1)
    state = sharding.full_tensors(source.state_dict())
    assert list(state) == list(source.state_dict())
    assert not any(sharding.is_sharded(t) for t in state.values())
    assert sharding.full_tensors(source.state_dict(), keep=False) == {}
    sharding.load_full(target.state_dict(), state)
    for name, tensor in target.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    with pytest.raises(ValueError, match="missing"):
        sharding.load_full(target.state_dict(), dict(list(state.items())[1:]))
    name = next(iter(state))
    bad = {**state, name: torch.zeros(3)}
    with pytest.raises(ValueError, match=f"{name}: shape"):
        sharding.load_full(target.state_dict(), bad)


def test_optimizer_state_whole_and_cut_again_is_the_same(tiny_tokenizer) -> None:
    model = make_tiny_lm(len(tiny_tokenizer))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.tensor([[2, 3, 4]])).logits.sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    whole = sharding.full_optimizer_state(state)
    assert sorted(whole["state"]) == sorted(state["state"])
    for index, moments in state["state"].items():
        assert torch.equal(whole["state"][index]["exp_avg"], moments["exp_avg"])
        assert whole["state"][index]["step"] is moments["step"] or torch.equal(
            whole["state"][index]["step"], moments["step"]
        )
    cut = sharding.sharded_optimizer_state(whole, list(model.parameters()))
    for index, moments in whole["state"].items():
        assert torch.equal(cut["state"][index]["exp_avg_sq"], moments["exp_avg_sq"])
    assert whole["param_groups"] == state["param_groups"]
