"""Each KL penalty form against the exact gradient of E[R - beta * KL] on a game small enough
to enumerate (``bench/kl_gradient.py``): the exact forms agree within sampling error, the
fidelity forms do not."""

from __future__ import annotations

import pytest
import torch

from bench import kl_gradient as kg
from cory_rl.agents import kl_penalty as kp


def test_the_enumerated_gradient_is_the_objectives():
    """The exact gradient itself, against finite differences of the enumerated objective."""
    game = kg.TabularGame.random(seed=3)
    beta = 0.7
    grad = kg.exact_gradient(game, beta)

    def objective(theta: torch.Tensor) -> float:
        copy = kg.TabularGame(theta, game.ref_logits, game.reward, game.states)
        logp = torch.log_softmax(copy.theta, dim=-1)
        logq = torch.log_softmax(copy.ref_logits, dim=-1)
        state_kl = (logp.exp() * (logp - logq)).sum(-1)
        total = 0.0
        for y in kg.all_answers():
            rows = [copy.states[y[:t]] for t in range(len(y))]
            p = float(sum(logp[s, tok] for s, tok in zip(rows, y, strict=True)).exp())
            total += p * (game.reward[y] - beta * float(sum(state_kl[s] for s in rows)))
        return total

    theta = game.theta.detach()
    eps = 1e-6
    for index in [(0, 0), (2, 1), (5, 2)]:
        up, down = theta.clone(), theta.clone()
        up[index] += eps
        down[index] -= eps
        numeric = (objective(up) - objective(down)) / (2 * eps)
        assert abs(numeric - float(grad[index])) < 1e-6


@pytest.mark.parametrize("beta", [1.0, 0.2])
@pytest.mark.parametrize("penalty", kp.EXACT)
def test_exact_forms_agree_with_the_exact_gradient(penalty, beta):
    result = kg.compare(penalty, beta=beta, n=2000, batches=40, seed=0)
    # 21 parameters: a largest |z| above 5 would be a 1-in-10^4 draw if the form is unbiased.
    assert result["max_abs_z"] < 5.0, result
    assert result["relative_bias"] < 4 * result["relative_se"] + 0.02, result


@pytest.mark.parametrize("penalty", kp.FIDELITY)
def test_fidelity_forms_are_biased(penalty):
    result = kg.compare(penalty, beta=1.0, n=2000, batches=40, seed=0)
    assert result["max_abs_z"] > 8.0, result
    assert result["relative_bias"] > 0.3, result


def test_the_default_is_exact_and_every_form_is_named_once():
    from cory_rl.agents.llm import LLMConfig

    assert kp.form(LLMConfig().kl_penalty).exact
    assert set(kp.EXACT) | set(kp.FIDELITY) == set(kp.FORMS)
    assert set(kp.OLD_ESTIMATORS.values()) <= set(kp.FORMS)
    with pytest.raises(ValueError, match="unknown KL penalty 'k9'"):
        kp.form("k9")
