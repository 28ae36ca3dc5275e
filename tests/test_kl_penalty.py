"""The KL penalty in each learner's update (``agents/kl_penalty.py``): the exact form's loss
part is each state's exact KL under the current policy, weighted by beta, reduced as the
learner reduces its policy loss; the old setting's name still runs a saved config as it ran.
The maths of every form against the exact gradient: tests/test_kl_gradient.py."""

from __future__ import annotations

import pytest
import torch

from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
from cory_rl.agents.policy import build_policies
from cory_rl.agents.ppo import PPOAgent, PPOConfig
from cory_rl.agents.reinforce import ReinforceAgent, ReinforceConfig
from tests.test_baselines import rollout_of, spy_on_gradient_pass

BETA = 0.1
COMMON = {
    "init_kl_coef": BETA,
    "adaptive_kl": False,
    "score_scaling": False,
    "learning_rate": 1e-4,
    "mini_batch_size": 4,
    "kl_penalty": "full",
}
ONE_EPOCH = {"ppo_epochs": 1}
LEARNERS = {
    "ppo": (PPOAgent, PPOConfig, {"whiten_advantages": False, **ONE_EPOCH}),
    "reinforce": (ReinforceAgent, ReinforceConfig, {"whiten_advantages": False}),
    "rloo": (RLOOAgent, RLOOConfig, {"whiten_advantages": False, **ONE_EPOCH}),
    "grpo": (GRPOAgent, GRPOConfig, {"scale_rewards": "none", **ONE_EPOCH}),
}


def moved_agent(name, tokenizer, lm):
    """A learner whose policy was moved away from its reference, so that the KL is not 0."""
    cls, config_cls, own = LEARNERS[name]
    [policy], reference = build_policies(lm, 1)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    cfg = config_cls(**COMMON, **own)
    extra = {"group_size": 2} if name in ("rloo", "grpo") else {}
    return cls(policy, reference, cfg, tokenizer.pad_token_id, **extra)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_the_exact_forms_loss_part_is_each_states_kl(name, tiny_tokenizer, tiny_lm):
    agent = moved_agent(name, tiny_tokenizer, tiny_lm)
    group = 2 if name in ("rloo", "grpo") else 1
    ro = rollout_of(agent, tiny_tokenizer, batch=4, budget=3, group_size=group)
    kl = agent.reference_pass(ro, "full")[0].double()  # (B, T) exact, zero on padding
    mask = ro.mask.double()
    assert kl.sum() > 1e-2, "the policy must differ from the reference"
    stats = agent.learn()  # one on-policy mini-batch: the loss is taken before the step
    expected = {
        "ppo": BETA * kl.sum() / mask.sum(),  # the token mean, as PPO's policy loss
        "reinforce": BETA * kl.sum() / mask.sum(),
        "rloo": BETA * kl.sum(dim=1).mean(),  # summed per answer, mean over answers
        "grpo": BETA * kl.sum() / mask.sum(),  # dapo: the batch's tokens per answer
    }[name]
    assert stats[f"{name}/loss_kl"] == pytest.approx(float(expected), rel=1e-3)


def test_a_fidelity_form_has_no_loss_part(tiny_tokenizer, tiny_lm):
    agent = moved_agent("ppo", tiny_tokenizer, tiny_lm)
    agent.config.kl_penalty = "full_in_reward"
    rollout_of(agent, tiny_tokenizer, batch=4, budget=3)
    assert "ppo/loss_kl" not in agent.learn()


def test_whitening_scales_the_loss_part_as_the_advantages(tiny_tokenizer, tiny_lm, monkeypatch):
    """Whitened advantages divide the credit by their std: the direct part is divided too,
    so that the coefficient keeps its meaning beside the reward."""
    agent = moved_agent("reinforce", tiny_tokenizer, tiny_lm)
    agent.config.whiten_advantages = True
    rollout_of(agent, tiny_tokenizer, batch=4, budget=3)
    seen = spy_on_gradient_pass(agent, monkeypatch)
    agent.learn()
    weights = seen["kl_weight"]
    assert torch.allclose(weights, weights[0].expand_as(weights))
    assert float(weights[0]) != pytest.approx(BETA)  # beta over the advantages' std


def test_a_saved_config_with_the_old_name_runs_as_it_ran(tmp_path):
    from cory_env.checks import SettingError
    from cory_rl.train.config.resolve import build_config

    file = tmp_path / "config.yaml"
    file.write_text("learner:\n  kl_estimator: full\n")
    assert build_config("smoke", file).learner["kl_penalty"] == "full_in_reward"
    file.write_text("learner:\n  kl_estimator: k1\n")
    assert build_config("smoke", file).learner["kl_penalty"] == "k1"
    file.write_text("learner:\n  kl_estimator: full\n  kl_penalty: full\n")
    with pytest.raises(SettingError, match="kl_estimator is the old name of kl_penalty"):
        build_config("smoke", file)


def test_the_paper_presets_keep_the_official_form_and_the_rest_the_exact_one():
    from cory_rl.train.config.presets import PRESETS

    for name, preset in PRESETS.items():
        form = preset.get("learner", {}).get("kl_penalty", "full")
        official = name.startswith("paper-") or name == "cpu-paper"
        assert form == ("full_in_reward" if official else "full"), name
