"""Evaluation metrics on fixed texts with hand-computed values, and KL against the reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from cory_rl.train.evaluation import inference, measures


def test_answer_tokens_are_words_and_punctuation():
    expected = ["the", "cat", ",", "the", "dog", "!", "!"]
    assert measures.answer_tokens("The cat, THE dog!!") == expected
    assert measures.answer_tokens("  ") == []


def test_distinct_n_counts_over_all_answers():
    texts = ["the cat sat", "the cat ran!"]
    # unigrams: the cat sat the cat ran ! -> 7, distinct {the, cat, sat, ran, !} = 5
    assert measures.distinct_n(texts, 1) == pytest.approx(5 / 7)
    # bigrams: (the cat)(cat sat) | (the cat)(cat ran)(ran !) -> 5, distinct 4
    assert measures.distinct_n(texts, 2) == pytest.approx(4 / 5)
    assert measures.distinct_n(["one", "two"], 2) == 0.0  # no bigram at all
    assert measures.distinct_n(["a b", "a b"], 2) == 0.5


@pytest.mark.parametrize(
    ("text", "repetitive"),
    [
        ("great great great movie", True),  # one token three times in a row
        ("!!!", True),  # punctuation marks are tokens
        ("and the and the and the", True),  # a bigram three times in a row
        ("a b c d a b c d a b c d", True),  # a 4-gram three times
        ("a b c d e a b c d e a b c d e", False),  # a 5-gram is longer than max_n
        ("great great movie", False),  # only twice
        ("the cat the dog the end", False),  # frequent, but never in a row
        ("", False),
    ],
)
def test_repetitive_answers(text, repetitive):
    assert measures.is_repetitive(text) is repetitive


@pytest.mark.parametrize(
    ("text", "tokens", "words"),
    [
        # the archive's short loop at KL 27.7: commas break the token n-grams
        ("joy, love, joy, love", False, True),
        ("love, love, love", False, True),  # one word three times, between commas
        ("great great movie", False, True),  # 2 of 3 words: at least half
        ("good movie", False, False),  # each word once
        ("the cat the dog the end", False, True),  # "the" makes half of six words
        ("the movie was the best", False, False),  # "the" twice in five: under half
        ("I loved it, I loved it, I loved it", False, True),  # a trigram three times
        ("!!!", True, False),  # no word at all
        ("", False, False),
    ],
)
def test_word_level_repetition_sees_short_loops(text, tokens, words):
    assert measures.is_repetitive(text) is tokens
    assert measures.is_word_repetitive(text) is words


def test_repetition_share_and_hit_budget():
    assert measures.repetition_share(["no no no", "fine", "ok ok ok ok", "a b"]) == 0.5
    assert measures.repetition_share([]) == 0.0
    assert measures.word_repetition_share(["joy, love, joy, love", "fine", "a b", "x x"]) == 0.5
    assert measures.word_repetition_share([]) == 0.0
    # budget 3, EOS id 1: used 3 tokens without EOS / ended by EOS at 3 / stopped early
    hit = measures.hit_budget(np.array([3, 3, 2]), 3, np.array([5, 1, 5]), eos_id=1)
    assert hit.tolist() == [True, False, False]


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n answers (c of them correct) holding a correct one."""
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(answers, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_a_count_over_all_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = brute_force_pass_at_k(n, c, k)
                assert measures.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert measures.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert measures.pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    correct = np.array([[1, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    assert measures.mean_pass_at_k(correct, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    assert measures.pass_ks(1) == [1] and measures.pass_ks(4) == [1, 2, 4]
    assert measures.pass_ks(10) == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        measures.pass_at_k(3, 1, 4)


def test_objectives_and_front():
    obj = measures.objectives([1.0, 0.5], [10.0, 100.0])
    assert obj["0.01"] == pytest.approx(((1 - 0.1) + (0.5 - 1.0)) / 2)
    assert obj["1e-05"] == pytest.approx(0.75 - 1e-5 * 55)
    points = [(1, 0.5), (2, 0.4), (0.5, 0.1), (3, 0.9), (2, 0.6)]
    assert measures.pareto_front(points) == [2, 0, 4, 3]


def test_turn_stats_kl_is_the_exact_kl_to_the_reference(tiny_tokenizer, tiny_lm):
    """Summed over each answer: sum_t sum_v p(v) (log p(v) - log q(v)), p the trained policy
    and q the reference, computed here from two plain forward passes of whole sequences."""
    import cory_env
    from cory_rl.agents.policy import build_policies
    from cory_rl.agents.ppo import PPOAgent, PPOConfig
    from cory_rl.train.core.games import play_games

    task = cory_env.custom_task(
        ["the movie was", "this film is very", "i love"],
        lambda q, r: [0.0] * len(r),
        max_new_tokens=5,
        context_length=16,
    )
    game = cory_env.batched_game(task, batch_size=6, n_agents=1, tokenizer=tiny_tokenizer)
    (policy,), reference = build_policies(tiny_lm, 1)
    with torch.no_grad():  # move the policy away from the reference
        for p in policy.lm.parameters():
            p.add_(0.05 * torch.randn_like(p))
    agent = PPOAgent(policy, reference, PPOConfig(), tiny_tokenizer.pad_token_id, seed=0)
    game.reset(seed=1)
    play_games(game, {"llm_0": agent})
    obs = game.observe("llm_0")
    kl = agent.turn_stats(obs)["kl"]
    for row in range(game.batch_size):
        ids = torch.as_tensor(obs["input_ids"][row][obs["attention_mask"][row] == 1])[None]
        n = int(obs["num_generated"][row])
        with torch.no_grad():
            logp = torch.log_softmax(policy.lm(ids).logits[0, -n - 1 : -1], -1)
            logq = torch.log_softmax(reference.lm(ids).logits[0, -n - 1 : -1], -1)
        direct = float((logp.exp() * (logp - logq)).sum())
        assert kl[row] == pytest.approx(direct, rel=1e-4, abs=1e-6)
    assert kl.min() > 0


def test_distinct_n_per_answer_and_pooled():
    texts = ["a a", "a b"]
    # per answer: {a}/2 = 1/2 and {a, b}/2 = 1, mean 0.75; pooled over both: {a, b}/4 = 0.5
    assert measures.distinct_n_per_answer(texts, 1) == pytest.approx(0.75)
    assert measures.distinct_n_pooled(texts, 1, pool=2) == pytest.approx(0.5)
    # an answer without a bigram is left out of the per-answer mean, not counted as 0
    assert measures.distinct_n_per_answer(["x", "a a a", "a b c"], 2) == pytest.approx(0.75)
    assert measures.distinct_n_per_answer(["one", ""], 2) is None
    # blocks of 2 in order: ["a a", "a a"] -> 1/4, ["a b", "c d"] -> 4/4; "e e" dropped
    five = ["a a", "a a", "a b", "c d", "e e"]
    assert measures.distinct_n_pooled(five, 1, pool=2) == pytest.approx((0.25 + 1.0) / 2)
    assert measures.distinct_n_pooled(five, 1, pool=5) == pytest.approx(5 / 10)
    assert measures.distinct_n_pooled(five, 1, pool=6) is None
    assert measures.DISTINCT_POOL == 64
    assert measures.distinct_n_pooled([f"w{i}" for i in range(64)], 1) == 1.0  # default pool
    assert measures.distinct_n_pooled([f"w{i}" for i in range(63)], 1) is None


def test_t_interval_uses_the_t_quantile():
    s = inference.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{2, 0.975}, std 1
    assert s["mean"] == 2.0 and s["std"] == pytest.approx(1.0) and s["n"] == 3
    assert s["ci"] == pytest.approx([2 - half, 2 + half])
    half90 = 2.919985580355516 / math.sqrt(3)  # t_{2, 0.95}
    assert inference.t_interval([1.0, 2.0, 3.0], 0.9)["ci"] == pytest.approx(
        [2 - half90, 2 + half90]
    )
    # two values 0, 1: std sqrt(1/2), t_{1, 0.975} = 12.706204736174698
    half2 = 12.706204736174698 * math.sqrt(0.5) / math.sqrt(2)
    assert inference.t_interval([0.0, 1.0])["ci"] == pytest.approx([0.5 - half2, 0.5 + half2])
    assert inference.t_interval([0.7]) == {"mean": 0.7, "std": None, "n": 1, "ci": None}
    assert inference.t_interval([0.1, 0.1, 0.1]) == {
        "mean": 0.1,
        "std": 0.0,
        "n": 3,
        "ci": [0.1, 0.1],
    }
    with pytest.raises(ValueError, match="no values"):
        inference.t_interval([])


def test_bootstrap_ci():
    # units 0 and 1: a resample's mean is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so the
    # 95% interval is [0, 1] and the 40% interval (quantiles 0.3, 0.7) is [1/2, 1/2]
    assert inference.bootstrap_ci([0.0, 1.0]) == [0.0, 1.0]
    assert inference.bootstrap_ci([0.0, 1.0], confidence=0.4) == [0.5, 0.5]
    rng = np.random.default_rng(5)
    values = rng.normal(size=30)
    # by hand: all resamples in one draw of the seeded generator, then the percentiles
    idx = np.random.default_rng(7).integers(0, 30, size=(500, 30))
    expected = np.quantile(values[idx].mean(axis=1), [0.05, 0.95])
    got = inference.bootstrap_ci(values, confidence=0.9, n_boot=500, seed=7)
    assert got == pytest.approx(expected.tolist(), rel=1e-12)
    assert inference.bootstrap_ci(values, seed=3) == inference.bootstrap_ci(values, seed=3)
    assert inference.bootstrap_ci(values, seed=3) != inference.bootstrap_ci(values, seed=4)
    lo, hi = inference.bootstrap_ci(values)
    assert lo < values.mean() < hi
    many = rng.normal(size=1000)
    lo_many, hi_many = inference.bootstrap_ci(many)
    assert lo_many < many.mean() < hi_many
    assert hi_many - lo_many < (hi - lo) / 3  # width ~ 1/sqrt(n): sqrt(1000/30) ~ 5.8
    assert inference.bootstrap_ci([0.1] * 7) == [0.1, 0.1]  # exact, no rounding of the mean
    assert inference.bootstrap_ci([0.3]) is None and inference.bootstrap_ci([]) is None


def test_per_unit_means_groups_by_unit():
    units, means = inference.per_unit_means([2, 0, 2, 1, 0, 2], [1.0, 4.0, 2.0, 5.0, 6.0, 6.0])
    assert units.tolist() == [0, 1, 2]
    assert means.tolist() == pytest.approx([5.0, 5.0, 3.0])  # (4+6)/2, 5, (1+2+6)/3
    units, means = inference.per_unit_means(["q2", "q1", "q2"], [1.0, 0.0, 0.0])
    assert units.tolist() == ["q1", "q2"] and means.tolist() == [0.0, 0.5]
    with pytest.raises(ValueError, match="one length"):
        inference.per_unit_means([0, 1], [1.0])


def test_welch_test_matches_the_formula():
    from scipy import stats

    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    va, vb = 5 / 3, 4.0  # squared deviations 5 over 3; 8 over 2
    sa, sb = va / 4, vb / 3
    se = math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / (sa**2 / 3 + sb**2 / 2)
    diff = 2.5 - 4.0
    p = 2 * stats.t.sf(abs(diff) / se, df)
    half = stats.t.ppf(0.975, df) * se
    w = inference.welch_test(a, b)
    assert w["diff"] == pytest.approx(diff) and w["df"] == pytest.approx(df)
    assert w["p"] == pytest.approx(p) and w["ci"] == pytest.approx([diff - half, diff + half])
    assert (w["n_a"], w["n_b"]) == (4, 3)
    assert df == pytest.approx(3.2347, abs=1e-4) and 0.2 < p < 0.4  # the hand numbers
    assert inference.welch_test(b, a)["diff"] == pytest.approx(-diff)
    # half-width at 90% uses t_{df, 0.95}
    w90 = inference.welch_test(a, b, confidence=0.9)
    assert w90["ci"][1] - w90["ci"][0] == pytest.approx(2 * stats.t.ppf(0.95, df) * se)
    assert inference.welch_test([1.0], [1.0, 2.0]) is None
    assert inference.welch_test([1.0, 2.0], [3.0]) is None
    # neither sample varies: the difference is certain
    certain = inference.welch_test([0.1, 0.1, 0.1], [0.3, 0.3])
    assert certain["p"] == 0.0 and certain["ci"] == [certain["diff"], certain["diff"]]
    assert certain["diff"] == pytest.approx(-0.2) and certain["df"] == 3.0
    same = inference.welch_test([0.1, 0.1, 0.1], [0.1, 0.1])
    assert same["p"] == 1.0 and same["ci"] == [0.0, 0.0] and same["diff"] == 0.0


def test_paired_test_is_a_one_sample_test_of_the_differences():
    from scipy import stats

    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [0.8, 1.9, 2.8, 3.9, 4.8]  # differences 0.2 0.1 0.2 0.1 0.2
    d = np.array(a) - np.array(b)
    mean, sd = d.mean(), d.std(ddof=1)
    t = mean / (sd / math.sqrt(5))
    half = stats.t.ppf(0.975, 4) * sd / math.sqrt(5)
    p = inference.paired_test(a, b)
    assert p["diff"] == pytest.approx(0.16) and p["df"] == 4 and p["n"] == 5
    assert p["p"] == pytest.approx(2 * stats.t.sf(abs(t), 4))
    assert p["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    assert p["ci"] == pytest.approx([mean - half, mean + half])
    # the pairs share most of their spread: paired sees the difference, Welch does not
    w = inference.welch_test(a, b)
    assert w["diff"] == pytest.approx(p["diff"])
    assert p["p"] < 0.01 and w["p"] > 0.5
    assert inference.paired_test([1.0], [0.0]) is None
    with pytest.raises(ValueError, match="one length"):
        inference.paired_test([1.0, 2.0], [1.0, 2.0, 3.0])
    certain = inference.paired_test([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert certain["p"] == 0.0 and certain["ci"] == [0.5, 0.5] and certain["diff"] == 0.5
    same = inference.paired_test([1.0, 2.0], [1.0, 2.0])
    assert same["p"] == 1.0 and same["ci"] == [0.0, 0.0]


def test_value_at_interpolates_on_the_first_segment_reaching_x():
    # rising: x = 1.5 lies on (1, 10) -> (2, 20)
    assert inference.value_at([0.0, 1.0, 2.0], [0.0, 10.0, 20.0], 1.5) == pytest.approx(15.0)
    assert inference.value_at([0.0, 1.0, 2.0], [0.0, 10.0, 20.0], 2.0) == pytest.approx(20.0)
    # overshoots to 4 and comes back through 2: the first crossing, (0,0)->(4,8), counts
    xs, ys = [0.0, 4.0, 1.0, 2.0], [0.0, 8.0, 5.0, 7.0]
    assert inference.value_at(xs, ys, 2.0) == pytest.approx(4.0)
    # x = 3 on the way up, (2, 1) -> (5, 4), gives 2; on the way down, (5, 4) -> (1, 0), 3
    xs, ys = [0.0, 2.0, 5.0, 1.0], [0.0, 1.0, 4.0, 0.0]
    assert inference.value_at(xs, ys, 3.0) == pytest.approx(2.0)
    # starts above x, goes further up, reaches x = 2 only coming back: (5, 6) -> (1, 2) gives 3
    assert inference.value_at([3.0, 5.0, 1.0], [0.0, 6.0, 2.0], 2.0) == pytest.approx(3.0)
    assert inference.value_at([5.0, 1.0], [0.0, 8.0], 4.0) == pytest.approx(2.0)  # falling
    assert inference.value_at([0.0, 1.0, 2.0], [0.0, 10.0, 20.0], 2.5) is None  # never reached
    assert inference.value_at([1.0], [3.0], 2.0) is None and inference.value_at([], [], 0.0) is None
    # the exact first point, even though the path comes back to x later
    assert inference.value_at([0.5, 1.0, 0.5], [7.0, 9.0, 1.0], 0.5) == 7.0
    assert inference.value_at([0.5], [7.0], 0.5) == 7.0  # a one-point trajectory at x
    # a flat start reaching x exactly at its end
    assert inference.value_at([0.0, 0.0, 1.0], [2.0, 3.0, 4.0], 1.0) == pytest.approx(4.0)


def test_holm_adjusts_p_values_by_hand():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06 (kept from falling), 0.06 ...
    # 0.01*4 = 0.04; 0.02*3 = 0.06; 0.03*2 = 0.06; 0.04*1 = 0.04 -> max so far 0.06.
    assert inference.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert inference.holm([0.5, None, 0.4]) == [pytest.approx(0.8), None, pytest.approx(0.8)]
    assert inference.holm([0.9, 0.6]) == [1.0, 1.0]  # capped at 1
    assert inference.holm([]) == [] and inference.holm([0.2]) == [0.2]


def test_hedges_g_by_hand():
    from scipy import stats

    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    pooled = math.sqrt((5 + 8) / 5)  # squared deviations 5 and 8 over 4 + 3 - 2
    g = (1 - 3 / (4 * 7 - 9)) * (2.5 - 4.0) / pooled
    se = math.sqrt(7 / 12 + g**2 / 14)
    z = stats.norm.ppf(0.975)
    out = inference.hedges_g(a, b)
    assert out["g"] == pytest.approx(g) and g == pytest.approx(-0.7834, abs=1e-4)
    assert out["ci"] == pytest.approx([g - z * se, g + z * se])
    assert inference.hedges_g([1.0, 1.0], [1.0, 1.0]) is None
    assert inference.hedges_g([1.0], [1.0, 2.0]) is None


def test_the_detectable_difference_is_found_with_the_power_asked():
    """At the returned difference, Welch's test rejects in about 80% of simulated
    experiments with those variances (many seeds, so that Welch's df hardly varies)."""
    from scipy import stats as st

    from cory_rl.train.evaluation import inference

    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.05, 20), rng.normal(0, 0.03, 20)
    delta = inference.detectable_difference(a, b)
    sa, sb = np.std(a, ddof=1), np.std(b, ddof=1)
    trials = 4000
    x = rng.normal(delta, sa, (trials, 20))
    y = rng.normal(0.0, sb, (trials, 20))
    rejected = st.ttest_ind(x, y, axis=1, equal_var=False).pvalue < 0.05
    assert abs(rejected.mean() - 0.8) < 0.025
    # Fewer seeds, a larger detectable difference; one seed or no spread: none.
    assert inference.detectable_difference(a[:2], b[:2]) > delta
    assert inference.detectable_difference([0.5], b) is None
    assert inference.detectable_difference([0.5, 0.5], [0.2, 0.2]) is None
    assert inference.welch_test(a, b)["detectable"] == pytest.approx(delta)
