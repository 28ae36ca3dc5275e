"""The numbers evaluation reports, as small pure functions (no models, no games).

Evaluation (``train/evaluate.py``) collects answers, scores and per-answer statistics; these
functions turn them into the reported metrics, and each is checked by hand in
``tests/test_metrics.py``. Definitions:

* **answer tokens**: the lower-cased words and punctuation marks of an answer
  (``re.findall(r"\\w+|[^\\w\\s]", text.lower())``), so that metrics do not depend on the
  model's tokenizer and ``"!!!"`` counts as three repeated tokens.
* **distinct-n** (Li et al. 2016): distinct n-grams / all n-grams, over all the answers of
  a row together (n-grams never span two answers); 0 when there are no n-grams.
* **repetitive answer**: some n-gram of 1 to 4 answer tokens occurs at least 3 times in a
  row (``great great great``, ``! ! !``, ``and the and the and the``). Its share over the
  answers is the repetition indicator of distribution collapse.
* **hit budget**: the answer used its whole token budget without ending in EOS.
* **pass@k** (Chen et al. 2021): with n answers to a query of which c are correct, the
  unbiased estimator ``1 - C(n-c, k) / C(n, k)``, averaged over queries.
* **mean, std, 95% interval**: sample mean, sample standard deviation (ddof 1) and the
  normal-approximation interval ``mean +- 1.96 std / sqrt(n)`` (answers to one query in
  a group are not independent, so with ``group_size > 1`` the interval is a bit narrow).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

ETAS = (1e-5, 1e-4, 1e-3, 1e-2)
"""The KL weights of the paper's combined objective ``r - eta * KL`` (rebuttal R1-3)."""
Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal distribution."""
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
    tokens = answer_tokens(text)
    for n in range(1, max_n + 1):
        span = n * repeats
        for start in range(len(tokens) - span + 1):
            unit = tokens[start : start + n]
            if all(tokens[start + r * n : start + (r + 1) * n] == unit for r in range(1, repeats)):
                return True
    return False


def repetition_share(texts: Sequence[str]) -> float:
    """The share of answers that are repetitive (:func:`is_repetitive`); 0.0 for none."""
    return float(np.mean([is_repetitive(t) for t in texts])) if len(texts) else 0.0


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


def summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std (ddof 1) and the normal-approximation 95% interval of the mean."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("summary of no values")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    half = Z95 * std / math.sqrt(x.size)
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half], "n": int(x.size)}


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
