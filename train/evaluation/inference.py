"""Intervals and tests: over seeds (t, Welch, Hedges' g, Holm) and over queries (bootstrap),
and a value read off a trajectory at a matched x. Pure functions, each checked by hand in
``tests/test_metrics.py``. Definitions:

* **mean, std**: sample mean and sample standard deviation (ddof 1) over answers; the
  interval of a mean over answers is the bootstrap over queries below, never a normal
  interval over answers (the answers to one query are not independent).
* **t interval**: over independent units (seeds), ``mean +- t_{n-1, (1+c)/2} std / sqrt(n)``
  with the sample std (ddof 1); none with one unit.
* **bootstrap interval**: the percentile interval of the mean over ``n_boot`` resamples
  (with replacement) of the units (one value per query: its mean, or a paired difference).
* **Welch test**: ``mean(a) - mean(b)`` of two independent samples, its t interval and
  two-sided p-value with the Welch-Satterthwaite degrees of freedom
  ``(va/na + vb/nb)^2 / ((va/na)^2/(na-1) + (vb/nb)^2/(nb-1))``.
* **detectable difference**: the smallest |mean(a) - mean(b)| that Welch's test at level
  ``alpha`` (two-sided) finds with probability ``power``, were the samples' variances the
  true ones: the noncentral t with the Welch-Satterthwaite degrees of freedom. What a
  comparison could have seen, beside what it saw.
* **paired test**: the one-sample t-test of the differences ``a_i - b_i`` (same seeds or
  same queries), ``n - 1`` degrees of freedom. In both tests, when no sample varies the
  difference is certain: p = 0 and interval ``[diff, diff]`` if it is not 0, else p = 1
  and interval ``[0, 0]``.
* **value at matched x**: along a trajectory in order (held-out KL and reward at successive
  evaluations), y linearly interpolated on the first segment that reaches x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _mean_var(x: np.ndarray) -> tuple[float, float]:
    """Mean and sample variance (ddof 1), exactly (x[0], 0.0) when all values are equal.

    Summing equal floats can leave rounding noise (std ~1e-17) that would turn a certain
    difference into a t statistic of 1e16; equal values are exactly constant here.
    """
    if np.all(x == x[0]):
        return float(x[0]), 0.0
    return float(x.mean()), float(x.var(ddof=1))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean, sample std (ddof 1) and Student-t interval of the mean over independent units.

    With few units (seeds) the normal quantile is too narrow; ``t_{n-1}`` is exact for
    normal units. One value has no spread: std and ci are None (reported as "n/a").
    """
    _check_confidence(confidence)
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("t_interval of no values")
    mean, var = _mean_var(x)
    if x.size == 1:
        return {"mean": mean, "std": None, "n": 1, "ci": None}
    std = math.sqrt(var)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * std / math.sqrt(x.size)
    return {"mean": mean, "std": std, "n": int(x.size), "ci": [mean - half, mean + half]}


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> list[float] | None:
    """Percentile bootstrap interval of the mean of units (e.g. per-query means).

    Resampling whole units keeps the answers to one query together, which the normal
    interval over answers ignores. Deterministic for a seed; None for fewer than 2 values;
    exactly ``[v, v]`` when every value is v.
    """
    _check_confidence(confidence)
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    if np.all(x == x[0]):
        return [float(x[0]), float(x[0])]
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return [float(lo), float(hi)]


def per_unit_means(units: Sequence, values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct units, mean of ``values`` per unit): per-answer numbers to per-query.

    The answers to one query are not independent; their mean is one unit for the bootstrap.
    """
    u, v = np.asarray(units), np.asarray(values, dtype=float)
    if u.shape != v.shape or u.ndim != 1:
        raise ValueError(f"units and values must be 1-D of one length, got {u.shape}, {v.shape}")
    distinct, inverse = np.unique(u, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.bincount(inverse, weights=v, minlength=distinct.size)
    counts = np.bincount(inverse, minlength=distinct.size)
    return distinct, sums / np.maximum(counts, 1)


def _t_test(diff: float, se: float, df: float, confidence: float) -> tuple[list[float], float]:
    """Interval and two-sided p-value of ``diff`` with standard error ``se`` and ``df``.

    ``se == 0`` means the difference is certain: ``[diff, diff]`` and p 0, or ``[0, 0]`` and
    p 1 when it is 0.
    """
    if se == 0.0:
        return ([diff, diff], 0.0) if diff != 0.0 else ([0.0, 0.0], 1.0)
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    p = float(2 * stats.t.sf(abs(diff) / se, df))
    return [diff - half, diff + half], p


def welch_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict | None:
    """Welch's t-test of ``mean(a) - mean(b)`` for two independent samples (e.g. seeds).

    Welch does not assume equal variances; its degrees of freedom are Welch-Satterthwaite's.
    None when either sample has fewer than 2 values. When neither sample varies the
    difference is certain: p = 0.0 and ci ``[diff, diff]`` if the means differ, p = 1.0 and
    ci ``[0, 0]`` if they are equal; df is then ``n_a + n_b - 2`` (Welch's is 0/0).
    """
    _check_confidence(confidence)
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(x), _mean_var(y)
    sa, sb = va / x.size, vb / y.size
    diff = ma - mb
    if sa + sb == 0.0:
        df = float(x.size + y.size - 2)
    else:
        df = (sa + sb) ** 2 / (sa**2 / (x.size - 1) + sb**2 / (y.size - 1))
    ci, p = _t_test(diff, math.sqrt(sa + sb), df, confidence)
    detectable = detectable_difference(x, y, alpha=1 - confidence)
    return {
        "diff": diff,
        "ci": ci,
        "p": p,
        "df": df,
        "n_a": int(x.size),
        "n_b": int(y.size),
        "detectable": detectable,
    }


def detectable_difference(
    a: Sequence[float], b: Sequence[float], power: float = 0.8, alpha: float = 0.05
) -> float | None:
    """The smallest |mean(a) - mean(b)| that Welch's test at ``alpha`` (two-sided) detects
    with probability ``power``, taking the samples' variances as the true ones. None when
    either sample has fewer than 2 values or neither varies (then any difference is
    certain)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return None
    (_, va), (_, vb) = _mean_var(x), _mean_var(y)
    sa, sb = va / x.size, vb / y.size
    if sa + sb == 0.0:
        return None
    se = math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / (sa**2 / (x.size - 1) + sb**2 / (y.size - 1))
    critical = float(stats.t.ppf(1 - alpha / 2, df))

    def shortfall(delta: float) -> float:
        shift = delta / se
        # The far tail's cdf comes out NaN for large shifts, where it is ~0.
        far = float(np.nan_to_num(stats.nct.cdf(-critical, df, shift), nan=0.0))
        return float(stats.nct.sf(critical, df, shift)) + far - power

    high = se
    while shortfall(high) < 0:
        high *= 2
    from scipy.optimize import brentq

    return float(brentq(shortfall, 0.0, high, xtol=1e-9 * se))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of p-values tested together (None stays None).

    The i-th smallest of m p-values is multiplied by m - i + 1 (i from 1), kept from falling
    below the one before it and capped at 1: a family-wise error rate at the level, with no
    assumption about how the tests depend on each other (the matched-KL points of one
    comparison read the same seeds' trajectories)."""
    present = sorted((float(p), i) for i, p in enumerate(p_values) if p is not None)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (len(present) - rank) * p))
        out[i] = running
    return out


def hedges_g(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict | None:
    """Hedges' g, the standardised difference ``(mean(a) - mean(b)) / pooled std`` with the
    small-sample correction J = 1 - 3 / (4 (n_a + n_b) - 9), and its normal-approximation
    interval (se^2 = (n_a + n_b) / (n_a n_b) + g^2 / (2 (n_a + n_b))). None for fewer than
    2 values a side or no spread at all (the standardised difference is undefined)."""
    _check_confidence(confidence)
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(x), _mean_var(y)
    n = x.size + y.size
    pooled = math.sqrt(((x.size - 1) * va + (y.size - 1) * vb) / (n - 2))
    if pooled == 0.0:
        return None
    g = (1 - 3 / (4 * n - 9)) * (ma - mb) / pooled
    se = math.sqrt(n / (x.size * y.size) + g**2 / (2 * n))
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return {"g": g, "ci": [g - z * se, g + z * se], "se": se}


def paired_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict | None:
    """Paired t-test: the one-sample t-test of ``a_i - b_i`` (same seeds or same queries).

    Pairing removes what a_i and b_i share (the seed's or query's difficulty), so it sees
    differences Welch misses. None for fewer than 2 pairs; when all differences are equal
    the rule of :func:`welch_test` applies (p 0 and ``[d, d]``, or p 1 and ``[0, 0]``).
    """
    _check_confidence(confidence)
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need one length, got {x.size} and {y.size}")
    if x.size < 2:
        return None
    diff, var = _mean_var(x - y)
    df = float(x.size - 1)
    ci, p = _t_test(diff, math.sqrt(var / x.size), df, confidence)
    return {"diff": diff, "ci": ci, "p": p, "df": df, "n": int(x.size)}


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """y where a trajectory (in order) first reaches x, linearly interpolated on that segment.

    Compares learners at matched KL: ``xs`` the held-out KL, ``ys`` the reward at successive
    evaluations. ``ys[0]`` if ``xs[0] == x``; None if the trajectory never reaches x.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys need one length, got {len(xs)} and {len(ys)}")
    if len(xs) == 0:
        return None
    if xs[0] == x:
        return float(ys[0])
    for i in range(len(xs) - 1):
        x0, x1 = xs[i], xs[i + 1]
        if x0 <= x <= x1 or x0 >= x >= x1:
            if x1 == x0:  # then x0 == x, which the segment before would have caught
                return float(ys[i])
            return float(ys[i] + (x - x0) / (x1 - x0) * (ys[i + 1] - ys[i]))
    return None
