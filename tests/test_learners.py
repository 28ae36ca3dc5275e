"""The learner registry: the documented own learner (docs/learners.md), mixes, game variants,
clear refusals."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

import cory_env
from cory_env.checks import SettingError
from cory_rl.agents.base import Learner
from cory_rl.agents.registry import Seat, available_learners, register_learner
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.training.run import run_training
from tests.conftest import make_tiny_gpt2, read_jsonl, tiny_config

LEARNERS_DOC = Path(__file__).resolve().parents[1] / "docs" / "learners.md"


def readme_learner() -> types.ModuleType:
    """Run docs/learners.md's "Write your own learner" code as a module (it registers
    itself)."""
    text = LEARNERS_DOC.read_text()
    match = re.search(r"```python\n# agents/unigram\.py\n(.*?)```", text, re.S)
    assert match, "docs/learners.md lost its 'Write your own learner' example"
    code = match.group(1)
    assert 25 <= len(code.strip().splitlines()) <= 60
    module = types.ModuleType("readme_unigram")
    exec(compile(code, "docs/learners.md:unigram", "exec"), module.__dict__)  # noqa: S102
    return module


def test_readme_learner_takes_a_seat_beside_ppo_and_resumes(tiny_model_dir, tmp_path):
    readme_learner()
    assert "unigram" in available_learners()
    learners = {"llm_0": "ppo", "llm_1": "unigram"}
    config = tiny_config(tiny_model_dir, tmp_path / "run", learners=learners, iterations=2)
    run = run_training(config)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert "llm_1/reward_mean" in rows[-1] and "llm_0/ppo/loss_policy" in rows[-1]
    assert (run.path / "checkpoint" / "llm_1" / "logits.npy").exists()
    config, resume = parse_args(["--resume", str(run.path), "--iterations", "3"])
    run_training(config, resume)
    assert [r["iteration"] for r in read_jsonl(run.path / "metrics.jsonl")] == [0, 1, 2]


def test_readme_learner_learns_a_reward(tiny_tokenizer):
    """Paid for the word 'great', the unigram learner learns to say it."""
    module = readme_learner()
    great = tiny_tokenizer.convert_tokens_to_ids("great")
    task = cory_env.custom_task(
        ["the movie was"],
        lambda q, r: [x.split().count("great") / 4 for x in r],
        max_new_tokens=4,
        context_length=16,
    )
    game = cory_env.batched_game(task, batch_size=32, n_agents=1, tokenizer=tiny_tokenizer)
    seat = Seat("llm_0", 0, 1, None, tiny_tokenizer, len(tiny_tokenizer), 0, "", None, None, 0)
    learner = module.UnigramLearner(seat, learning_rate=2.0)
    rewards = []
    for it in range(40):
        game.reset(seed=0 if it == 0 else None)
        while not game.done:
            game.step(learner.act(game.observe("llm_0")), agent="llm_0")
        learner.end_rollout(game.observe("llm_0"), game.rewards["llm_0"])
        rewards.append(learner.learn()["reward_mean"])
    assert np.mean(rewards[:5]) < 0.1 and np.mean(rewards[-5:]) > 0.5, rewards
    assert learner.probs().argmax() == great


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"learners": {"llm_0": "ppo", "llm_1": "sarsa"}}, "unknown learner 'sarsa'"),
        ({"learners": {"llm_0": "ppo"}}, r"seats \['llm_1'\] have no learner"),
        ({"learners": {"llm_0": "ppo", "llm_1": "ppo", "llm_2": "ppo"}}, "no seats"),
        ({"algorithm": "moe", "n_agents": 3}, "n_agents must be an integer >= 2 and <= 2"),
        ({"algorithm": "cory", "n_agents": 9}, "n_agents must be an integer >= 2 and <= 8"),
        (
            {"learners": {"llm_0": {"learner": "ppo", "clip": 2}, "llm_1": "ppo"}},
            "unknown settings",
        ),
        ({"learner": {"reset_freq": 3}}, "settings of no seat's learner"),
        ({"models": {"llm_5": "gpt2"}}, "no seats"),
    ],
)
def test_bad_learner_setups_are_refused_before_any_model_loads(
    tiny_model_dir, tmp_path, no_model_load, overrides, message
):
    with pytest.raises(SettingError, match=message):
        run_training(tiny_config(tiny_model_dir, tmp_path / "run", **overrides))


def test_group_baselines_refuse_a_game_without_groups(tiny_model_dir, tmp_path, no_model_load):
    for name in ("rloo", "grpo"):
        with pytest.raises(SettingError, match="group_size"):
            tiny_config(tiny_model_dir, tmp_path, algorithm=name, group_size=1)


def test_a_learner_class_without_the_required_methods_is_refused_at_registration():
    with pytest.raises(TypeError, match="not a Learner"):

        @register_learner("duck")
        class Duck:
            def act(self, obs):
                return obs

    with pytest.raises(
        TypeError, match=r"does not define the Learner methods \['learn', 'save', 'load', 'turn"
    ):

        @register_learner("half")
        class Half(Learner):
            def act(self, obs):
                return obs

            def end_rollout(self, obs, rewards):
                pass

    assert "half" not in available_learners()


def test_a_learner_name_another_learner_holds_is_refused_like_a_task_name():
    from cory_rl.agents import registry

    def mine(seat):
        """Not PPO."""

    with pytest.raises(ValueError, match="learner 'ppo' is already registered.*replace=True"):
        register_learner("ppo")(mine)
    assert registry.learner_spec("ppo").factory is not mine
    original = registry.learner_spec("ppo")
    try:
        register_learner("ppo", replace=True)(mine)
        assert registry.learner_spec("ppo").factory is mine
        registry._REGISTRY["ppo"] = original
        # The same factory again (a reloaded module): not a clash.
        register_learner("ppo", config=original.config)(original.factory)
    finally:
        registry._REGISTRY["ppo"] = original


def test_a_factory_that_returns_no_learner_is_refused(tiny_model_dir, tmp_path):
    register_learner("broken")(lambda seat: object())
    try:
        config = tiny_config(
            tiny_model_dir, tmp_path / "run", learners={"llm_0": "ppo", "llm_1": "broken"}
        )
        with pytest.raises(TypeError, match="not a Learner: subclass"):
            build_game_and_learners(config)
    finally:
        from cory_rl.agents import registry

        registry._REGISTRY.pop("broken")


def test_three_agent_chain_trains_and_rotates_roles(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path / "run", n_agents=3, sees="all")
    run = run_training(config)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert [r["llm_0/role"] for r in rows] == ["pioneer", "observer_2", "observer_1"]
    assert all(f"llm_{i}/kl" in rows[0] for i in range(3))


def test_game_variants_reach_the_game(tiny_model_dir, tmp_path):
    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        sees="none",
        lam=-0.5,
        reward_norm=True,
        role_exchange_period=10**9,
        group_size=2,
    )
    game, learners = build_game_and_learners(config)
    settings = game.settings
    assert (settings.sees, settings.lam, settings.reward_norm, game.group_size) == (
        "none",
        -0.5,
        True,
        2,
    )
    assert settings.role_exchange_period == 10**9


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """A GPT-2 with a word-level tokenizer of another vocabulary (another order, more words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import WORDS

    words = ["<pad>", "<eos>", "<unk>", *reversed(WORDS[2:]), "extra", "words", "here"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("other-model")
    make_tiny_gpt2(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_heterogeneous_seats_each_have_their_model_tokenizer_and_reference(
    tiny_model_dir, other_model_dir, tmp_path
):
    config = tiny_config(
        tiny_model_dir, tmp_path / "run", models={"llm_1": other_model_dir}, iterations=2
    )
    game, learners = build_game_and_learners(config)
    a, b = learners["llm_0"], learners["llm_1"]
    assert a.reference is not b.reference
    assert type(a.model.lm).__name__ == "LlamaForCausalLM"
    assert type(b.model.lm).__name__ == "GPT2LMHeadModel"
    assert game.action_space("llm_0").n != game.action_space("llm_1").n
    assert game.tokenizers[0] is not game.tokenizers[1]
    run = run_training(config)
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert len(rows) == 2 and rows[-1]["llm_1/kl"] >= 0


def test_moe_evaluation_keeps_the_answer_with_the_higher_value(tiny_model_dir, tmp_path):
    """Per query, MoE keeps the answer of the agent whose critic values it higher."""
    from cory_rl.train.evaluation.evaluator import Evaluator

    config = tiny_config(tiny_model_dir, tmp_path, algorithm="moe")
    assert (config.game.lam, config.game.sees, config.game.n_agents) == (0.0, "none", 2)
    game, learners = build_game_and_learners(config)

    class Valued:
        def __init__(self, inner, value):
            self.inner, self.value = inner, value

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def turn_stats(self, obs):
            stats = self.inner.turn_stats(obs)
            return {**stats, "value": np.full(len(obs["role"]), self.value)}

    evaluator = Evaluator(config, game.tokenizers, samples=1, batch_size=4, max_queries=4)
    game = evaluator.game
    for winner in ("llm_0", "llm_1"):
        wrapped = {a: Valued(x, 1.0 if a == winner else -1.0) for a, x in learners.items()}
        _, _, moe, _ = evaluator.play(wrapped, "trained", show=0)
        assert len(moe) == 2 * game.batch_size  # one batch per rotation of the roles
        # The game still holds the last batch played: its kept answers are the winner's.
        assert moe[-game.batch_size :] == game.scores[winner].tolist()
        loser = "llm_1" if winner == "llm_0" else "llm_0"
        assert game.scores[winner].tolist() != game.scores[loser].tolist()


def test_train_calls_learners_through_the_declared_interface_only():
    """No ``hasattr``/``getattr`` on a Learner attribute's name anywhere in train/: every
    capability the loop, evaluation, checkpoints and engines use is declared in Learner."""
    import ast

    declared = {name for name in dir(Learner) if not name.startswith("_")}
    root = Path(__file__).resolve().parents[1] / "train"
    probes = []
    for file in root.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in declared
            ):
                probes.append(f"{file.relative_to(root)}:{node.lineno} {node.args[1].value}")
    assert not probes, probes
