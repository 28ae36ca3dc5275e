"""Evaluation metrics on fixed texts with hand-computed values, and KL against the reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from train import metrics


def test_answer_tokens_are_words_and_punctuation():
    expected = ["the", "cat", ",", "the", "dog", "!", "!"]
    assert metrics.answer_tokens("The cat, THE dog!!") == expected
    assert metrics.answer_tokens("  ") == []


def test_distinct_n_counts_over_all_answers():
    texts = ["the cat sat", "the cat ran!"]
    # unigrams: the cat sat the cat ran ! -> 7, distinct {the, cat, sat, ran, !} = 5
    assert metrics.distinct_n(texts, 1) == pytest.approx(5 / 7)
    # bigrams: (the cat)(cat sat) | (the cat)(cat ran)(ran !) -> 5, distinct 4
    assert metrics.distinct_n(texts, 2) == pytest.approx(4 / 5)
    assert metrics.distinct_n(["one", "two"], 2) == 0.0  # no bigram at all
    assert metrics.distinct_n(["a b", "a b"], 2) == 0.5


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
    assert metrics.is_repetitive(text) is repetitive


def test_repetition_share_and_hit_budget():
    assert metrics.repetition_share(["no no no", "fine", "ok ok ok ok", "a b"]) == 0.5
    assert metrics.repetition_share([]) == 0.0
    # budget 3, EOS id 1: used 3 tokens without EOS / ended by EOS at 3 / stopped early
    hit = metrics.hit_budget(np.array([3, 3, 2]), 3, np.array([5, 1, 5]), eos_id=1)
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
                assert metrics.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert metrics.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert metrics.pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    correct = np.array([[1, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    assert metrics.mean_pass_at_k(correct, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    assert metrics.pass_ks(1) == [1] and metrics.pass_ks(4) == [1, 2, 4]
    assert metrics.pass_ks(10) == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        metrics.pass_at_k(3, 1, 4)


def test_summary_objectives_and_front():
    s = metrics.summary([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(5 / 3)  # squared deviations 2.25+0.25+0.25+2.25 = 5, over n-1 = 3
    half = 1.959963984540054 * std / 2
    assert s["mean"] == 2.5 and s["std"] == pytest.approx(std) and s["n"] == 4
    assert s["ci95"] == pytest.approx([2.5 - half, 2.5 + half])
    assert metrics.summary([0.7])["ci95"] == [0.7, 0.7]
    obj = metrics.objectives([1.0, 0.5], [10.0, 100.0])
    assert obj["0.01"] == pytest.approx(((1 - 0.1) + (0.5 - 1.0)) / 2)
    assert obj["1e-05"] == pytest.approx(0.75 - 1e-5 * 55)
    points = [(1, 0.5), (2, 0.4), (0.5, 0.1), (3, 0.9), (2, 0.6)]
    assert metrics.pareto_front(points) == [2, 0, 4, 3]


def test_turn_stats_kl_is_the_exact_kl_to_the_reference(tiny_tokenizer, tiny_lm):
    """Summed over each answer: sum_t sum_v p(v) (log p(v) - log q(v)), p the trained policy
    and q the reference, computed here from two plain forward passes of whole sequences."""
    import cory_env
    from agents.policy import build_policies
    from agents.ppo import PPOAgent, PPOConfig
    from train.loop import play_games

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
