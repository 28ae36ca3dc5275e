"""Every reported number of an evaluation, recomputed from its answers alone.

An evaluation records each answer (``ANSWER_COLUMNS``: which model, agent and role gave
it, to which query and sample, with which budget, and its reward, KL, entropy, length
and text). Everything here is a function of those columns, so ``eval.json`` can be
summarised again by anyone, and the base model's answers of another file (the one made
before training) can serve as the baseline of a later one.

Intervals over answers are over *queries*: the answers to one query are not
independent, so the interval is a percentile bootstrap of per-query means. The paired
difference to the base model is matched on (agent, role, query, sample), which were
answered with the same budget and the same sampling uniforms, averaged per query, and
bootstrapped over queries. Definitions of the other metrics: ``cory_rl.train.evaluation.measures``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cory_rl.train.evaluation import inference, measures

ANSWER_COLUMNS = (
    "model",
    "agent",
    "role",
    "query",
    "sample",
    "budget",
    "reward",
    "kl",
    "entropy",
    "length",
    "hit_budget",
    "text",
)
"""One list per column, one entry per answer (``eval.json["answers"]``)."""
REFERENCE, TRAINED = "reference", "trained"
"""Model labels: the untrained base model, and the agents of a run."""


def empty_answers() -> dict[str, list[Any]]:
    return {column: [] for column in ANSWER_COLUMNS}


def concat(*tables: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {c: [v for t in tables for v in t[c]] for c in ANSWER_COLUMNS}


def _role_key(role: str) -> tuple[int, str]:
    return (0 if role == "pioneer" else 1, role)


def cells(answers: dict[str, list[Any]]) -> list[tuple[str, str, str]]:
    """The (model, agent, role) cells that hold answers, reference first, pioneer first."""
    keys = set(zip(answers["model"], answers["agent"], answers["role"], strict=True))
    return sorted(keys, key=lambda k: (k[0] != REFERENCE, k[0], k[1], _role_key(k[2])))


def rows_where(answers: dict[str, list[Any]], **match: Any) -> np.ndarray:
    """Row numbers whose columns equal ``match`` (a column given as None matches all)."""
    keep = np.ones(len(answers["model"]), dtype=bool)
    for column, value in match.items():
        if value is not None:
            keep &= np.asarray(answers[column], dtype=object) == value
    return np.flatnonzero(keep)


def point_rows(answers: dict[str, list[Any]], model: str, point: str) -> np.ndarray:
    """The rows of one summary point of ``model``: a role, or ``all`` of its answers."""
    return rows_where(answers, model=model, role=None if point == "all" else point)


def _column(answers: dict[str, list[Any]], column: str, rows: np.ndarray) -> np.ndarray | None:
    values = [answers[column][i] for i in rows]
    if any(v is None for v in values):
        return None
    return np.asarray(values, dtype=float)


def _over_queries(values: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Mean, std over answers, and the bootstrap interval over per-query means."""
    _, per_query = inference.per_unit_means(queries, values)
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "ci95": inference.bootstrap_ci(per_query),
        "n": int(len(values)),
        "queries": int(len(per_query)),
    }


def paired_difference(
    answers: dict[str, list[Any]], rows: np.ndarray, base: dict[str, list[Any]], model: str
) -> dict[str, Any] | None:
    """Mean over queries of (reward - base reward), matched answer by answer on (agent,
    role, query, sample), with the bootstrap interval over queries; None without a base."""
    keys = ("agent", "role", "query", "sample")
    base_rows = rows_where(base, model=model)
    by_key = {tuple(base[k][i] for k in keys): base["reward"][i] for i in base_rows}
    pairs = [
        (answers["query"][i], answers["reward"][i] - by_key[key])
        for i in rows
        if (key := tuple(answers[k][i] for k in keys)) in by_key
    ]
    if not pairs:
        return None
    queries, diffs = (np.asarray(x) for x in zip(*pairs, strict=True))
    _, per_query = inference.per_unit_means(queries, diffs.astype(float))
    return {
        "mean": float(per_query.mean()),
        "ci95": inference.bootstrap_ci(per_query),
        "pairs": len(pairs),
        "queries": int(len(per_query)),
    }


def cell_metrics(
    answers: dict[str, list[Any]],
    rows: np.ndarray,
    etas: Sequence[float],
    checked: bool,
    base: dict[str, list[Any]] | None,
) -> dict[str, Any]:
    """The reported numbers of one set of answers (``cory_rl.train.evaluation.measures``
    defines each)."""
    reward = _column(answers, "reward", rows)
    kl = _column(answers, "kl", rows)
    entropy = _column(answers, "entropy", rows)
    queries = np.asarray([answers["query"][i] for i in rows])
    texts = [answers["text"][i] for i in rows]
    row: dict[str, Any] = {
        "reward": _over_queries(reward, queries),
        "kl": _over_queries(kl, queries) if kl is not None else None,
        "objective": measures.objectives(reward, kl, etas) if kl is not None else None,
        "reward_minus_base": None,
        "pass@k": None,
        "repetitive": measures.repetition_share(texts),
        "repetitive_words": measures.word_repetition_share(texts),
        "hit_budget": float(np.mean([answers["hit_budget"][i] for i in rows])),
        "length": float(np.mean([answers["length"][i] for i in rows])),
        "entropy": float(entropy.mean()) if entropy is not None else None,
    }
    for n in (1, 2):
        row[f"distinct_{n}"] = measures.distinct_n_per_answer(texts, n)
        row[f"distinct_{n}_pooled"] = measures.distinct_n_pooled(texts, n, measures.DISTINCT_POOL)
    if base is not None:
        row["reward_minus_base"] = paired_difference(answers, rows, base, REFERENCE)
    if checked:
        row["pass@k"] = pass_at_k_by_agent(answers, rows)
    return row


def pass_at_k_by_agent(answers: dict[str, list[Any]], rows: np.ndarray) -> dict[str, float]:
    """``{k: pass@k}`` of answer-checked ``rows`` for every k of :func:`measures.pass_ks`:
    each agent's samples of a query are its n (:func:`measures.pass_at_k`), averaged over
    queries, and a cell pooled over agents averages the agents' values. Agents answer with
    the same sampling uniforms (common random numbers), so their answers to one query are
    not independent draws (identical for two copies of the base model) and pooling them as
    one query's n would bias pass@k (k > 1) low."""
    by_key: dict[tuple[Any, Any], list[bool]] = {}
    for i in rows:
        key = (answers["agent"][i], answers["query"][i])
        by_key.setdefault(key, []).append(float(answers["reward"][i]) >= 1.0)
    n = min(len(v) for v in by_key.values())
    correct = np.array([v[:n] for v in by_key.values()], dtype=bool)
    return {str(k): measures.mean_pass_at_k(correct, k) for k in measures.pass_ks(n)}


def reference_use(answers: dict[str, list[Any]], model: str) -> dict[str, Any] | None:
    """Whether the observer uses its reference: its pass@1 after a right pioneer answer and
    after a wrong one in the same game (the partner's answer to the same query and sample;
    docs/evaluation.md). Two-agent games of an answer-checked task; None otherwise."""
    rows = rows_where(answers, model=model)
    agents = sorted({answers["agent"][i] for i in rows})
    if len(agents) != 2 or "observer" not in {answers["role"][i] for i in rows}:
        return None
    pioneer = {
        (answers["agent"][i], answers["query"][i], answers["sample"][i]): float(
            answers["reward"][i]
        )
        >= 1.0
        for i in rows
        if answers["role"][i] == "pioneer"
    }
    given: dict[bool, list[float]] = {True: [], False: []}
    for i in rows:
        if answers["role"][i] != "observer":
            continue
        partner = agents[1 - agents.index(answers["agent"][i])]
        right = pioneer.get((partner, answers["query"][i], answers["sample"][i]))
        if right is not None:
            given[right].append(float(answers["reward"][i]) >= 1.0)
    return {
        "observer_given_right": float(np.mean(given[True])) if given[True] else None,
        "observer_given_wrong": float(np.mean(given[False])) if given[False] else None,
        "pioneer_right": len(given[True]),
        "pioneer_wrong": len(given[False]),
    }


def summarise(
    answers: dict[str, list[Any]],
    etas: Sequence[float] = measures.ETAS,
    checked: bool = False,
    base: dict[str, list[Any]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """One row per (model, agent, role) cell, and per model the pooled summary per role
    and over all roles (``all``). ``base``: the answers holding the ``reference`` model
    (``answers`` itself when it has them), for the paired differences of other models."""
    if base is None and REFERENCE in answers["model"]:
        base = answers
    rows = []
    for model, agent, role in cells(answers):
        picked = rows_where(answers, model=model, agent=agent, role=role)
        paired = base if model != REFERENCE else None
        rows.append(
            {
                "model": model,
                "agent": agent,
                "role": role,
                **cell_metrics(answers, picked, etas, checked, paired),
            }
        )
    summary: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(m for m, _, _ in cells(answers)):
        roles = sorted({r for m, _, r in cells(answers) if m == model}, key=_role_key)
        for point in (*roles, "all"):
            picked = point_rows(answers, model, point)
            paired = base if model != REFERENCE else None
            numbers = cell_metrics(answers, picked, etas, checked, paired)
            summary.setdefault(model, {})[point] = pooled_numbers(numbers)
        use = reference_use(answers, model) if checked else None
        if use is not None:
            summary[model]["observer"].update(use)
    return rows, summary


def pooled_numbers(numbers: dict[str, Any]) -> dict[str, Any]:
    """The few numbers per model and role that comparisons read (``train/compare.py``)."""
    out = {
        "reward": numbers["reward"]["mean"],
        "reward_ci95": numbers["reward"]["ci95"],
        "n": numbers["reward"]["n"],
        "queries": numbers["reward"]["queries"],
        "distinct_2": numbers["distinct_2"],
        "distinct_2_pooled": numbers["distinct_2_pooled"],
        "repetitive": numbers["repetitive"],
        "repetitive_words": numbers["repetitive_words"],
        "entropy": numbers["entropy"],
    }
    if numbers["kl"] is not None:
        out["kl"] = numbers["kl"]["mean"]
    if numbers["reward_minus_base"] is not None:
        out["reward_minus_base"] = numbers["reward_minus_base"]
    if numbers["pass@k"] is not None:
        out["pass@k"] = numbers["pass@k"]
    return out


# ----------------------------------------------------------------------------- markdown
def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _interval(ci: Sequence[float] | None, digits: int = 3) -> str:
    return "n/a" if ci is None else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def to_markdown(result: dict[str, Any]) -> str:
    """Two tables: reward, paired difference, KL and objectives; then pass@k and collapse."""
    etas = result["etas"]
    rows = result["rows"]
    ks = sorted({int(k) for r in rows for k in (r["pass@k"] or {})})
    es = result["eval_set"]
    when = "" if result.get("updates") is None else f" after {result['updates']} updates"
    seats = result.get("seats")
    what = result["run"] or "the base model"
    if seats:
        what = "seats " + ", ".join(f"{seat}: {label}" for seat, label in seats.items())
    head = (
        f"Evaluation of {what}{when}: task {result['task']}, "
        f"{result['held_out']['note']}; {len(es['queries'])} distinct queries x "
        f"{es['samples']} samples, budgets and sampling uniforms fixed by seed {es['seed']}"
        f"{'' if result.get('common_random_numbers', True) else ' (budgets only: a learner here cannot take common random numbers)'}."  # noqa: E501
    )
    notes = (
        "Intervals are 95% percentile bootstraps over queries. reward - base: the paired "
        "difference to the base model on the same (agent, role, query, sample), averaged "
        f"per query. Distinct-n per answer: mean over answers of each answer's own ratio; "
        f"pooled: over blocks of {measures.DISTINCT_POOL} answers, averaged over blocks."
    )
    lines = [head, "", notes, ""]
    if result.get("references"):
        measured = ", ".join(f"{seat} against {ref}" for seat, ref in result["references"].items())
        lines += [
            f"KL of seated model folders to the base they share a vocabulary with: {measured}.",
            "",
        ]
    untrained = [
        a
        for a, kind in (result.get("reference_is") or {}).items()
        if not kind.startswith("the base model")
    ]
    if untrained:
        lines += [
            f"The reference rows of {', '.join(untrained)} are an untrained copy of the "
            "seat's learner: it has no base model.",
            "",
        ]
    cols = [
        "model",
        "agent",
        "role",
        "answers",
        "reward",
        "95% CI",
        "reward - base",
        "95% CI",
        "KL",
        *(f"r - {eta:g} KL" for eta in etas),
    ]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        rw, kl, obj, diff = r["reward"], r["kl"], r["objective"] or {}, r["reward_minus_base"]
        cells_ = [
            r["model"],
            r["agent"],
            r["role"],
            str(rw["n"]),
            f"{rw['mean']:.3f} ± {rw['std']:.3f}",
            _interval(rw["ci95"]),
            "" if diff is None else f"{diff['mean']:+.3f}",
            "" if diff is None else _interval(diff["ci95"]),
            "" if kl is None else f"{kl['mean']:.3f} ± {kl['std']:.3f}",
        ]
        cells_ += [_num(obj.get(f"{eta:g}")) if obj else "" for eta in etas]
        lines.append("| " + " | ".join(cells_) + " |")
    lines.append("")
    cols = [
        "model",
        "agent",
        "role",
        *(f"pass@{k}" for k in ks),
        "distinct-1 (answer)",
        "distinct-2 (answer)",
        f"distinct-1 (pooled {measures.DISTINCT_POOL})",
        f"distinct-2 (pooled {measures.DISTINCT_POOL})",
        "repetitive (tokens)",
        "repetitive (words)",
        "hit budget",
        "length",
        "entropy",
    ]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        passes = r["pass@k"] or {}
        cells_ = [r["model"], r["agent"], r["role"], *(_num(passes.get(str(k))) for k in ks)]
        cells_ += [
            _num(r["distinct_1"]),
            _num(r["distinct_2"]),
            _num(r["distinct_1_pooled"]),
            _num(r["distinct_2_pooled"]),
            _num(r["repetitive"]),
            _num(r.get("repetitive_words")),
            _num(r["hit_budget"]),
            _num(r["length"], 1),
            _num(r["entropy"]),
        ]
        lines.append("| " + " | ".join(cells_) + " |")
    for model, points in result["summary"].items():
        observer = points.get("observer", {})
        if "pioneer_right" in observer:
            lines += [
                "",
                f"Reference use ({model}): the observer's pass@1 is "
                f"{_num(observer['observer_given_right'])} after a right pioneer answer "
                f"({observer['pioneer_right']} games) and "
                f"{_num(observer['observer_given_wrong'])} after a wrong one "
                f"({observer['pioneer_wrong']} games).",
            ]
    if result.get("score_moe"):
        moe = ", ".join(f"{m} {v:.3f}" for m, v in result["score_moe"].items())
        lines += ["", f"MoE (per query the answer of higher value): reward {moe}."]
    return "\n".join(lines) + "\n"
