"""What a set of answers shows, as small pure functions (no models, no games): diversity,
repetition, the budget, pass@k, the combined objective. The evaluator
(``cory_rl.train.evaluation.evaluator``) collects answers, scores and per-answer statistics;
these turn them into the reported metrics, each checked by hand in
``tests/test_metrics.py``; intervals and tests are ``cory_rl.train.evaluation.inference``.
Definitions:

* **answer tokens**: the lower-cased words and punctuation marks of an answer
  (``re.findall(r"\\w+|[^\\w\\s]", text.lower())``), so that metrics do not depend on the
  model's tokenizer and ``"!!!"`` counts as three repeated tokens.
* **distinct-n** (Li et al. 2016): distinct n-grams / all n-grams, over all the answers of
  a row together (n-grams never span two answers); 0 when there are no n-grams.
* **repetitive answer**: some n-gram of 1 to 4 answer tokens occurs at least 3 times in a
  row (``great great great``, ``! ! !``, ``and the and the and the``). Its share over the
  answers is the repetition indicator of distribution collapse.
* **word-repetitive answer**: the same in words alone (``\\w+``, lower-cased; punctuation
  left out), where a short loop shows: one word makes at least half of the answer's words
  (and occurs twice or more: ``joy, love, joy, love``), or a word n-gram of 1 to 4 words
  occurs at least 3 times in a row. The token-level measure above misses the first kind
  (its commas break the n-grams); both are reported.
* **hit budget**: the answer used its whole token budget without ending in EOS.
* **pass@k** (Chen et al. 2021): with n answers to a query of which c are correct, the
  unbiased estimator ``1 - C(n-c, k) / C(n, k)``, averaged over queries.
* **distinct-n per answer**: each answer's own distinct n-grams / its n-grams, averaged over
  the answers that have an n-gram; it does not depend on how many answers there are.
* **pooled distinct-n**: distinct-n over consecutive blocks of ``DISTINCT_POOL`` answers,
  averaged over the blocks (an incomplete last block is dropped), so that rows with
  different numbers of answers compare.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

ETAS = (1e-5, 1e-4, 1e-3, 1e-2)
"""The KL weights of the paper's combined objective ``r - eta * KL`` (rebuttal R1-3)."""
DISTINCT_POOL = 64
"""Answers per block of pooled distinct-n: pooled distinct-n falls as answers are added (the
same n-grams recur), so it is only comparable over a fixed number of answers."""
_TOKEN = re.compile(r"\w+|[^\w\s]")


def answer_tokens(text: str) -> list[str]:
    """Lower-cased words and punctuation marks: a tokenizer-independent unit for diversity."""
    return _TOKEN.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The n-grams of one token sequence, in order (none if it is shorter than n)."""
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Iterable[str], n: int) -> float:
    """Distinct n-grams over all n-grams of all answers; 0.0 when there is no n-gram."""
    grams = [g for text in texts for g in ngrams(answer_tokens(text), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def is_repetitive(text: str, max_n: int = 4, repeats: int = 3) -> bool:
    """Whether some n-gram (n = 1..max_n answer tokens) occurs ``repeats`` times in a row."""
    return has_run(answer_tokens(text), max_n, repeats)


def repetition_share(texts: Sequence[str]) -> float:
    """The share of answers that are repetitive (:func:`is_repetitive`); 0.0 for none."""
    return float(np.mean([is_repetitive(t) for t in texts])) if len(texts) else 0.0


_WORD = re.compile(r"\w+")


def answer_words(text: str) -> list[str]:
    """Lower-cased words, punctuation left out: the unit of word-level repetition."""
    return _WORD.findall(text.lower())


def has_run(units: Sequence[str], max_n: int = 4, repeats: int = 3) -> bool:
    """Whether some n-gram of ``units`` (n = 1..max_n) occurs ``repeats`` times in a row."""
    for n in range(1, max_n + 1):
        for start in range(len(units) - n * repeats + 1):
            unit = units[start : start + n]
            if all(units[start + r * n : start + (r + 1) * n] == unit for r in range(1, repeats)):
                return True
    return False


def is_word_repetitive(text: str) -> bool:
    """One word makes at least half of the words (twice or more), or a word n-gram repeats
    three times in a row (module doc)."""
    words = answer_words(text)
    if not words:
        return False
    top = max(words.count(w) for w in set(words))
    return (top >= 2 and 2 * top >= len(words)) or has_run(words)


def word_repetition_share(texts: Sequence[str]) -> float:
    """The share of answers that are word-repetitive (:func:`is_word_repetitive`)."""
    return float(np.mean([is_word_repetitive(t) for t in texts])) if len(texts) else 0.0


def hit_budget(
    lengths: np.ndarray, budget: int, last_tokens: np.ndarray, eos_id: int
) -> np.ndarray:
    """Per answer: it used all ``budget`` tokens and its last token is not EOS."""
    return (np.asarray(lengths) >= budget) & (np.asarray(last_tokens) != eos_id)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one query with ``n`` answers of which ``c`` are correct.

    ``1 - C(n-c, k) / C(n, k)``: the chance that k answers drawn without replacement from
    the n include a correct one, computed as a product to stay exact for large n.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_pass_at_k(correct: np.ndarray, k: int) -> float:
    """pass@k averaged over queries; ``correct`` is a (queries, n) boolean array."""
    correct = np.asarray(correct, dtype=bool)
    n = correct.shape[1]
    return float(np.mean([pass_at_k(n, int(row.sum()), k) for row in correct]))


def pass_ks(n: int) -> list[int]:
    """The k to report for n answers per query: 1, then powers of two, then n."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    return ks + [n] if n > 1 else ks


def objectives(
    rewards: Sequence[float], kls: Sequence[float], etas: Sequence[float] = ETAS
) -> dict[str, float]:
    """Mean ``r - eta * KL`` per eta (keys as ``f"{eta:g}"``: ``1e-05``, ..., ``0.01``)."""
    r, kl = np.asarray(rewards, dtype=float), np.asarray(kls, dtype=float)
    return {f"{eta:g}": float(np.mean(r - eta * kl)) for eta in etas}


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated (low KL, high reward) points, by increasing KL.

    A point is dominated when another has KL <= and reward >= with one strictly better.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def distinct_n_per_answer(texts: Iterable[str], n: int) -> float | None:
    """Mean over answers of their own distinct-n: independent of the number of answers.

    Answers without an n-gram are left out; None when no answer has one.
    """
    shares = []
    for text in texts:
        grams = ngrams(answer_tokens(text), n)
        if grams:
            shares.append(len(set(grams)) / len(grams))
    return float(np.mean(shares)) if shares else None


def distinct_n_pooled(texts: Sequence[str], n: int, pool: int = DISTINCT_POOL) -> float | None:
    """:func:`distinct_n` over consecutive blocks of exactly ``pool`` answers, averaged.

    A last incomplete block is dropped, so every block is comparable; None when there are
    fewer than ``pool`` answers.
    """
    if pool < 1:
        raise ValueError(f"pool must be at least 1, got {pool}")
    blocks = [texts[i : i + pool] for i in range(0, len(texts) - pool + 1, pool)]
    return float(np.mean([distinct_n(b, n) for b in blocks])) if blocks else None
