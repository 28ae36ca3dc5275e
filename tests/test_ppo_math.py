"""Hand-computed checks of agents/ppo_math.py.

Every expected number below is written literally and derived in a comment, so a
wrong formula (swapped gamma/lam, unclipped loss, reversed KL, ...) fails.
"""

import math

import numpy as np
import pytest
import torch

from cory_rl.agents.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    gae,
    kl_per_token,
    kl_sampled,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    scale_scores,
    token_rewards,
    value_loss,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# B=2, T=3; row 1 is right-padded at t=2 (its entries there are garbage on purpose).
MASK = t([[1, 1, 1], [1, 1, 0]])


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(actual, t(expected), atol=atol, rtol=0)


# ---------------------------------------------------------------- masked statistics


def test_masked_mean_and_var():
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    # all valid: (1+2+3+4+5)/5 = 3; per row: 6/3 = 2, 9/2 = 4.5 (100 is padding)
    close(masked_mean(x, MASK), 3.0)
    close(masked_mean(x, MASK, dim=1), [2.0, 4.5])
    # deviations from 3: -2,-1,0,1,2 -> squares sum 10; biased 10/5 = 2, unbiased 10/4 = 2.5
    close(masked_var(x, MASK, unbiased=False), 2.0)
    close(masked_var(x, MASK), 2.5)
    # -inf in padding must not leak into the mean
    y = t([[1.0, 2.0, 3.0], [4.0, 5.0, -math.inf]])
    close(masked_mean(y, MASK), 3.0)
    with pytest.raises(ValueError):
        masked_var(x, t([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten():
    # valid entries 1,2,3: mean 2, unbiased var 1 -> whitened -1, 0, 1 (eps 1e-8 ignorable)
    x = t([[1.0, 2.0, 3.0, 100.0]])
    m = t([[1, 1, 1, 0]])
    w = masked_whiten(x, m)
    close(w[:, :3], [[-1.0, 0.0, 1.0]], atol=1e-7)
    # shift_mean=False adds the mean (2) back: 1, 2, 3
    close(masked_whiten(x, m, shift_mean=False)[:, :3], [[1.0, 2.0, 3.0]], atol=1e-7)

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 7, generator=g, dtype=D) * 5 + 3
    zm = (torch.rand(4, 7, generator=g) > 0.3).to(D)
    wz = masked_whiten(z, zm)
    assert abs(masked_mean(wz, zm).item()) < 1e-9
    assert masked_var(wz, zm).item() == pytest.approx(1.0, abs=1e-6)
    wz2 = masked_whiten(z, zm, shift_mean=False)
    assert masked_mean(wz2, zm).item() == pytest.approx(masked_mean(z, zm).item(), abs=1e-9)


# ---------------------------------------------------------------- KL


def test_kl_per_token_exact_three_token_vocab():
    p = t([0.8, 0.1, 0.1])
    q = t([0.4, 0.4, 0.2])
    # KL(p||q) = 0.8 ln2 + 0.1 ln(1/4) + 0.1 ln(1/2) = (0.8 - 0.2 - 0.1) ln2 = 0.5 ln2
    # (the reverse, KL(q||p) = 0.6 ln2 = 0.41589, would fail)
    close(kl_per_token(p.log(), q.log()), 0.34657359027997264)
    close(kl_per_token(q.log(), p.log()), 0.4158883083359672)
    # zero-probability token in pi (log-prob -inf) contributes 0, not NaN:
    # p = [.5,.5,0], q = [.4,.4,.2]: 2 * 0.5 ln(0.5/0.4) = ln 1.25
    lp = t([0.5, 0.5, 0.0]).log().requires_grad_()
    kl = kl_per_token(lp, q.log())
    close(kl.detach(), 0.22314355131420976)
    kl.backward()
    assert torch.isfinite(lp.grad).all()


def test_kl_per_token_batch_shapes_zero_and_positive():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 5, generator=g, dtype=D).log_softmax(-1)
    b = torch.randn(2, 3, 5, generator=g, dtype=D).log_softmax(-1)
    kl = kl_per_token(a, b)
    assert kl.shape == (2, 3)
    assert (kl > 0).all()
    close(kl_per_token(a, a), [[0.0] * 3] * 2)
    # equals a manual sum over the vocabulary
    manual = (a.exp() * (a - b)).sum(-1)
    torch.testing.assert_close(kl, manual)


def test_kl_sampled_estimators():
    # sampled token: p = 0.5, q = 0.25 -> r = q/p = 0.5
    lp, lq = t(math.log(0.5)), t(math.log(0.25))
    close(kl_sampled(lp, lq), math.log(2))  # k1 = ln 0.5 - ln 0.25 = ln 2
    # k3 = (r - 1) - ln r = -0.5 + ln2 = 0.19315 (with r = p/q it would be 1 - ln2 = 0.30685)
    close(kl_sampled(lp, lq, "k3"), 0.1931471805599453)
    # reversed: p = 0.25, q = 0.5 -> k1 = -ln2, abs = ln2, mse = 0.5 ln2^2, k3 = 1 - ln2
    close(kl_sampled(lq, lp, "k1"), -math.log(2))
    close(kl_sampled(lq, lp, "abs"), math.log(2))
    close(kl_sampled(lq, lp, "mse"), 0.2402265069591007)
    close(kl_sampled(lq, lp, "k3"), 0.3068528194400547)
    close(kl_sampled(lp, lp, "k3"), 0.0)
    with pytest.raises(ValueError, match="k1.*k3.*abs.*mse"):
        kl_sampled(lp, lq, "k2")


# ---------------------------------------------------------------- rewards and GAE


def test_token_rewards_score_at_last_valid_token():
    score = t([2.0, -1.0])
    kl = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    rewards, non_score = token_rewards(score, kl, MASK, kl_coef=0.5)
    # -0.5 * kl; padding (row 1, t=2) zeroed
    close(non_score, [[-0.05, -0.1, -0.15], [-0.2, -0.25, 0.0]])
    # score at t=2 for row 0 (-0.15 + 2 = 1.85) and at t=1 for row 1 (-0.25 - 1 = -1.25)
    close(rewards, [[-0.05, -0.1, 1.85], [-0.2, -1.25, 0.0]])
    with pytest.raises(ValueError, match=r"\[1\]"):
        token_rewards(score, kl, t([[1, 0, 0], [0, 0, 0]]), 0.5)


REWARDS = t([[0.1, 0.2, 1.0], [0.5, -0.5, 9.0]])  # 9.0 is padding
VALUES = t([[0.3, 0.4, 0.5], [0.2, 0.6, 7.0]])  # 7.0 is padding


def test_gae_gamma1_lam095():
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, gae_lambda=0.95)
    # row 0: t2: d = 1.0 + 0 - 0.5 = 0.5,                 A = 0.5
    #        t1: d = 0.2 + 0.5 - 0.4 = 0.3,               A = 0.3 + 0.95*0.5   = 0.775
    #        t0: d = 0.1 + 0.4 - 0.3 = 0.2,               A = 0.2 + 0.95*0.775 = 0.93625
    # row 1: t2 padding -> 0; t1 is the last token, next value 0:
    #        t1: d = -0.5 + 0 - 0.6 = -1.1,               A = -1.1
    #        t0: d = 0.5 + 0.6 - 0.2 = 0.9,               A = 0.9 - 0.95*1.1   = -0.145
    close(adv, [[0.93625, 0.775, 0.5], [-0.145, -1.1, 0.0]])
    # returns = A + V (padding 0)
    close(ret, [[1.23625, 1.175, 1.0], [0.055, -0.5, 0.0]])


def test_gae_other_gamma_lam():
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=0.9, gae_lambda=0.5)
    # gamma*lam = 0.45 (same product if swapped, but delta uses gamma alone)
    # row 0: t2: d = 0.5,                                 A = 0.5
    #        t1: d = 0.2 + 0.9*0.5 - 0.4 = 0.25,          A = 0.25 + 0.45*0.5   = 0.475
    #        t0: d = 0.1 + 0.9*0.4 - 0.3 = 0.16,          A = 0.16 + 0.45*0.475 = 0.37375
    # row 1: t1: d = -0.5 - 0.6 = -1.1,                   A = -1.1
    #        t0: d = 0.5 + 0.9*0.6 - 0.2 = 0.84,          A = 0.84 - 0.45*1.1   = 0.345
    close(adv, [[0.37375, 0.475, 0.5], [0.345, -1.1, 0.0]])
    close(ret, [[0.67375, 0.875, 1.0], [0.545, -0.5, 0.0]])


def test_gae_padding_contributes_nothing():
    base_adv, base_ret = gae(REWARDS, VALUES, MASK)
    r2, v2 = REWARDS.clone(), VALUES.clone()
    r2[1, 2], v2[1, 2] = -1e3, 1e3
    adv, ret = gae(r2, v2, MASK)
    torch.testing.assert_close(adv, base_adv)
    torch.testing.assert_close(ret, base_ret)
    # a row truncated to 2 tokens equals GAE run on that row alone with T=2
    adv_row, _ = gae(REWARDS[1:, :2], VALUES[1:, :2], torch.ones(1, 2, dtype=D))
    torch.testing.assert_close(adv[1:, :2], adv_row)


# ---------------------------------------------------------------- losses


def test_policy_loss_clipping_and_gradients():
    ratio = t([[1.5, 0.5, 1.0], [1.5, 0.9, 3.0]])
    adv = t([[1.0, -2.0, 0.5], [-1.0, 1.0, 100.0]])  # row 1, t=2 is padding
    old = t([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    logp = (old + ratio.log()).requires_grad_()
    loss, stats = policy_loss(logp, old, adv, MASK, clip_range=0.2)
    # per token max(-A r, -A clip(r, 0.8, 1.2)):
    #   (0,0) r=1.5 A=1:  max(-1.5, -1.2) = -1.2  clipped
    #   (0,1) r=0.5 A=-2: max( 1.0,  1.6) =  1.6  clipped
    #   (0,2) r=1   A=.5: -0.5
    #   (1,0) r=1.5 A=-1: max( 1.5,  1.2) =  1.5  (pessimistic, unclipped)
    #   (1,1) r=0.9 A=1:  -0.9
    # mean = (-1.2 + 1.6 - 0.5 + 1.5 - 0.9)/5 = 0.1   (unclipped would be -0.08)
    close(loss.detach(), 0.1)
    close(stats["clipfrac"], 0.4)  # 2 of 5
    # approx_kl = 0.5 * mean(ln(r)^2) = 0.5*(2 ln1.5^2 + ln0.5^2 + ln0.9^2)/5
    close(stats["approx_kl"], 0.08203577599642153)
    loss.backward()
    # d/dlogp of -A r / 5 = -A r / 5 on unclipped tokens, 0 where the clipped branch wins
    close(logp.grad, [[0.0, 0.0, -0.1], [0.3, -0.18, 0.0]])


def test_value_loss_clipping_and_gradients():
    v = t([[1.0, 0.0, 0.5], [0.0, 3.0, 50.0]]).requires_grad_()
    old = t([[0.5, 0.1, 0.4], [1.0, 2.5, 0.0]])
    ret = t([[2.0, -1.0, 0.5], [0.5, 3.0, -50.0]])  # row 1, t=2 is padding
    loss, stats = value_loss(v, old, ret, MASK, clip_range_value=0.2)
    # per token max((v-R)^2, (clip(v, old-.2, old+.2)-R)^2):
    #   (0,0) clip 1.0->0.7: max(1, 1.69) = 1.69  clipped
    #   (0,1) in range:      1
    #   (0,2) in range:      0
    #   (1,0) clip 0->0.8:   max(0.25, 0.09) = 0.25  (unclipped)
    #   (1,1) clip 3->2.7:   max(0, 0.09) = 0.09  clipped
    # 0.5 * (1.69 + 1 + 0 + 0.25 + 0.09)/5 = 0.303   (unclipped would be 0.225)
    close(loss.detach(), 0.303)
    close(stats["vf_clipfrac"], 0.4)
    loss.backward()
    # unclipped tokens: 0.5 * 2 (v-R)/5 = (v-R)/5; clipped tokens get 0 (clamp saturates)
    close(v.grad, [[0.0, 0.2, 0.0], [-0.1, 0.0, 0.0]])


# ---------------------------------------------------------------- KL controllers


def test_adaptive_kl_controller():
    ctl = AdaptiveKLController(init_kl_coef=0.4, target=6.0, horizon=10000)
    ctl.update(6.6, n_steps=256)
    # err = 6.6/6 - 1 = 0.1; mult = 1 + 0.1*256/10000 = 1.00256; 0.4*1.00256
    assert ctl.value == pytest.approx(0.401024, rel=1e-12)
    ctl.update(3.0, n_steps=512)
    # err = -0.5 clipped to -0.2; mult = 1 - 0.2*512/10000 = 0.98976
    assert ctl.value == pytest.approx(0.39691751424, rel=1e-12)
    ctl.update(torch.tensor(60.0), n_steps=1000)
    # err = 9 clipped to 0.2; mult = 1.02 (unclipped would be 1.9)
    assert ctl.value == pytest.approx(0.4048558645248, rel=1e-12)

    other = AdaptiveKLController(1.0, 1.0, 1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict()

    fixed = FixedKLController(0.2)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.2
    fixed2 = FixedKLController(0.0)
    fixed2.load_state_dict(fixed.state_dict())
    assert fixed2.value == 0.2


# ---------------------------------------------------------------- running moments


def test_running_moments_matches_numpy():
    batches = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0], [-5.0, 0.5, 7.0]]
    rm = RunningMoments()
    seen: list[float] = []
    for b in batches:
        bm, bs = rm.update(torch.tensor(b, dtype=D))
        seen += b
        assert bm == pytest.approx(np.mean(b))
        assert bs == pytest.approx(np.std(b, ddof=1))
        assert rm.mean == pytest.approx(np.mean(seen))
        assert rm.var == pytest.approx(np.var(seen))
        assert rm.std == pytest.approx(np.std(seen, ddof=1))
        assert rm.count == pytest.approx(len(seen))
    rm2 = RunningMoments()
    rm2.load_state_dict(rm.state_dict())
    assert rm2.state_dict() == rm.state_dict()


def test_scale_scores():
    s = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # first batch: running mean 2.5, std sqrt(5/3) = 1.2909944
    out = scale_scores(s, RunningMoments())
    torch.testing.assert_close(out, torch.tensor([-1.161895, -0.3872983, 0.3872983, 1.161895]))
    out = scale_scores(s, RunningMoments(), use_normalization=False)
    torch.testing.assert_close(out, torch.tensor([0.7745967, 1.5491933, 2.3237900, 3.0983867]))
    out = scale_scores(s, RunningMoments(), clip=1.0)
    torch.testing.assert_close(out, torch.tensor([-1.0, -0.3872983, 0.3872983, 1.0]))
    # scaling off: moments untouched, only the clip applies
    rm = RunningMoments()
    out = scale_scores(s, rm, use_scaling=False, clip=2.5)
    torch.testing.assert_close(out, torch.tensor([1.0, 2.0, 2.5, 2.5]))
    assert rm.count < 1e-20
