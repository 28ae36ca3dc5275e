"""Update health: early stopping at ``target_kl``, every learner's ratio statistics, and the
warning a run gives when its updates sit outside the healthy band."""

from __future__ import annotations

from pathlib import Path

import pytest

import cory_env
from cory_env.checks import SettingError
from cory_rl.agents.policy import build_policies
from cory_rl.agents.ppo import PPOAgent, PPOConfig
from cory_rl.train.core.health import Band, HealthWatch
from cory_rl.train.training.loop import play_batch
from tests.conftest import make_tiny_lm
from tests.test_ppo_agent import target_task


def one_update(tokenizer, learning_rate, target_kl, **settings):
    """One PPO update of 4 epochs x 2 mini-batches on a fresh tiny model."""
    cfg = PPOConfig(
        mini_batch_size=4,
        ppo_epochs=4,
        learning_rate=learning_rate,
        target_kl=target_kl,
        **settings,
    )
    [policy], reference = build_policies(make_tiny_lm(len(tokenizer)), 1)
    agent = PPOAgent(policy, reference, cfg, tokenizer.pad_token_id, seed=0)
    game = cory_env.batched_game(
        target_task(tokenizer), batch_size=8, n_agents=1, tokenizer=tokenizer
    )
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    steps_before = agent.optimizer.state_dict()["state"]
    assert not steps_before
    stats = agent.learn()
    state = agent.optimizer.state_dict()["state"]
    adam_steps = int(next(iter(state.values()))["step"]) if state else 0
    return stats, adam_steps


@pytest.mark.parametrize("clip", [None, 1e9])  # stepping inside the backward, and the plain step
def test_target_kl_stops_a_large_update_early_and_logs_fewer_steps(tiny_tokenizer, clip):
    stats, adam_steps = one_update(tiny_tokenizer, 3e-2, 0.01, max_grad_norm=clip)
    assert stats["update/stopped_early"] == 1.0
    assert 1 <= stats["update/steps"] < 8
    assert adam_steps == stats["update/steps"]  # the stopping mini-batch took no step
    free, free_steps = one_update(tiny_tokenizer, 3e-2, None, max_grad_norm=clip)
    assert free["update/steps"] == free_steps == 8 and free["update/stopped_early"] == 0.0
    assert free["ppo/approx_kl"] > 1.5 * 0.01  # without the target the update went past it


def test_target_kl_does_not_stop_a_small_update(tiny_tokenizer):
    stats, adam_steps = one_update(tiny_tokenizer, 1e-7, 0.01)
    assert stats["update/steps"] == adam_steps == 8
    assert stats["update/stopped_early"] == 0.0
    assert stats["ppo/approx_kl"] < 0.015


def test_target_kl_is_checked():
    with pytest.raises(SettingError, match="target_kl"):
        PPOConfig(target_kl=-0.01).validate()
    with pytest.raises(SettingError, match="target_kl"):
        PPOConfig(target_kl=0).validate()


@pytest.mark.parametrize("name", ["reinforce", "rloo", "grpo"])
def test_every_learner_reports_token_approx_kl_and_ratio(tiny_tokenizer, name):
    from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
    from cory_rl.agents.reinforce import ReinforceAgent, ReinforceConfig

    cls, config = {
        "reinforce": (ReinforceAgent, ReinforceConfig),
        "rloo": (RLOOAgent, RLOOConfig),
        "grpo": (GRPOAgent, GRPOConfig),
    }[name]
    extra = {} if cls is ReinforceAgent else {"group_size": 2}
    game = cory_env.batched_game(
        target_task(tiny_tokenizer),
        batch_size=8,
        n_agents=1,
        tokenizer=tiny_tokenizer,
        group_size=2,
    )
    cfg = config(mini_batch_size=4, learning_rate=1e-1, target_kl=0.001)
    [policy], reference = build_policies(make_tiny_lm(len(tiny_tokenizer)), 1)
    agent = cls(policy, reference, cfg, tiny_tokenizer.pad_token_id, seed=0, **extra)
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    stats = agent.learn()
    assert stats[f"{name}/approx_kl"] >= 0 and stats[f"{name}/ratio"] > 0
    assert stats["update/steps"] == 1.0 and stats["update/stopped_early"] == 1.0


def rows(approx_kls, clipfracs, agent="llm_0"):
    return [
        {
            "iteration": i,
            f"{agent}/ppo/approx_kl": k,
            f"{agent}/ppo/clipfrac": c,
            f"{agent}/update/steps": 8.0,
            f"{agent}/ppo/vf_clipfrac": 0.9,
        }
        for i, (k, c) in enumerate(zip(approx_kls, clipfracs, strict=True))
    ]


def test_the_health_warning_fires_on_an_unhealthy_run_only():
    # The study's first updates: approx_kl 3.6, clipfrac 0.59; then the pilot's 0.13 / 0.4.
    sick = HealthWatch().add_all(rows([3.61, 0.13, 0.12, 0.01] * 3, [0.59, 0.4, 0.35, 0.1] * 3))
    assert sick.unhealthy() and sick.unhealthy_share == 0.75
    text = sick.warning()
    assert "75%" in text and "--learning_rate" in text and "--mini_batch_size" in text
    assert "--ppo_epochs" in text and "--batch_size" in text and "--target_kl" in text
    well = HealthWatch().add_all(rows([0.01, 0.02, 0.3, 0.03] * 3, [0.05, 0.1, 0.15, 0.2] * 3))
    assert well.unhealthy_share == 0.25 and not well.unhealthy() and well.warning() is None
    assert "approx_kl median 0.0250, clipfrac median 0.125" in well.summary()
    strict = HealthWatch(Band(approx_kl=0.015, clipfrac=0.2)).add_all(
        rows([0.01, 0.02, 0.3, 0.03] * 3, [0.05, 0.1, 0.15, 0.2] * 3)
    )
    assert strict.unhealthy()  # the band is a setting


def test_too_few_updates_are_not_judged():
    """A smoke run's three updates, one of them outside: no warning, whatever the share."""
    few = HealthWatch().add_all(rows([0.3, 0.01, 0.01], [0.5, 0.1, 0.1]))
    assert few.unhealthy_share > 0.25 and not few.judged
    assert not few.unhealthy() and few.warning() is None
    one_short = HealthWatch().add_all(
        rows([0.3] * 12, [0.5] * 12) + rows([0.3] * 9, [0.5] * 9, agent="llm_1")
    )
    assert not one_short.judged  # every agent needs its own ten


def test_health_reads_each_agent_and_skips_what_is_not_an_update():
    watch = HealthWatch().add_all(
        [
            *rows([0.01], [0.1]),
            *rows([0.2], [0.5], agent="llm_1"),
            {"eval/all/reward": 0.5, "iteration": 3},
            {"llm_0/reinforce/approx_kl": 0.01, "llm_0/reinforce/ratio": 1.0},
        ]
    )
    assert sorted(watch.agents) == ["llm_0", "llm_1"]
    assert watch.agents["llm_0"].updates == 2 and watch.agents["llm_0"].clipfrac[1] is None
    assert watch.agents["llm_1"].unhealthy == 1


def test_a_run_says_its_updates_were_unhealthy(tiny_model_dir, tmp_path, capsys):
    from cory_rl.train.training.run import run_training
    from tests.conftest import tiny_config

    sick = {"mini_batch_size": 4, "ppo_epochs": 4, "learning_rate": 5e-2}
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "run",
        "ppo",
        batch_size=8,
        iterations=10,
        checkpoint_every=10,
        learner=sick,
    )
    run_training(config)
    out = capsys.readouterr()
    assert "outside the healthy band" in out.out and "warning:" in out.out
    assert "update health" in out.out and "llm_0    approx_kl median" in out.out
    config = tiny_config(
        tiny_model_dir,
        tmp_path / "calm",
        "ppo",
        batch_size=8,
        iterations=3,
        learner={"mini_batch_size": 8, "ppo_epochs": 1, "learning_rate": 1e-7},
    )
    run_training(config)
    out = capsys.readouterr()
    assert "too few updates to judge their health" in out.out
    assert "outside the healthy band" not in out.out + out.err
    config = tiny_config(
        tiny_model_dir, tmp_path / "short", "ppo", batch_size=8, iterations=3, learner=sick
    )
    run_training(config)
    out = capsys.readouterr()
    assert "too few updates to judge their health" in out.out and "warning:" not in out.out


def test_the_tuning_rule_picks_the_best_healthy_value_and_the_smaller_of_a_tie():
    from cory_rl.train.analysis.tuning import Pilot, pick

    def pilot(algorithm, value, healthy, score):
        return Pilot(Path("x"), algorithm, value, healthy, "", score)

    pilots = [
        pilot("ppo", 1e-6, True, 0.20),
        pilot("ppo", 1e-5, True, 0.40),
        pilot("ppo", 1e-4, False, 0.90),  # the best score, but unhealthy
        pilot("cory", 1e-6, True, 0.305),
        pilot("cory", 1e-5, True, 0.31),
        pilot("grpo", 1e-5, False, 0.5),
    ]
    picked = pick(pilots, tie=0.01)
    assert picked["ppo"].value == 1e-5
    assert picked["cory"].value == 1e-6  # within the tie: the smaller rate
    assert picked["grpo"] is None
