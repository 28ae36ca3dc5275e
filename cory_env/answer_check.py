"""The CORY paper's GSM8K answer checker, shared by the gsm8k and arith tasks and the rewards.

A leaf module (it imports nothing from cory_env), so both ``cory_env.tasks`` and
``cory_env.rewards`` import it at top level without an import cycle.

Rules (from the official implementation): lowercase the response; if it contains
"the answer is", take the first number after that phrase, else the last number in
the text; strip thousands commas and a trailing dot. A prediction is right when it
equals the gold number after ``####``. We compare numerically so that ``1,000``,
``1000`` and ``1000.00`` all count as the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

ANSWER_PHRASE = "the answer is"

# A number: optional minus (not when glued to a word, so "2019-2020" gives 2019 and
# 2020), digits with optional thousands separators, optional decimal part; or ".5".
NUMBER_RE = re.compile(r"(?<![\w.])-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")


def _clean(number: str) -> str:
    return number.replace(",", "").rstrip(".")


def extract_answer(text: str) -> str | None:
    """The predicted number in a model response, or None if it has no number."""
    text = text.lower()
    if ANSWER_PHRASE in text:
        after = text.split(ANSWER_PHRASE, 1)[1]
        found = NUMBER_RE.search(after)
        if found is not None:
            return _clean(found.group())
        # "the answer is" with no number after it: fall back to the whole text.
    numbers = NUMBER_RE.findall(text)
    return _clean(numbers[-1]) if numbers else None


def gold_answer(gsm8k_answer: str) -> str:
    """The gold number after ``####`` in a GSM8K answer field, commas stripped."""
    if "####" not in gsm8k_answer:
        raise ValueError(
            f"GSM8K answer has no '####' line with the final number: {gsm8k_answer[-80:]!r}"
        )
    final = gsm8k_answer.rsplit("####", 1)[1].strip()
    if not final:
        raise ValueError(f"GSM8K answer has nothing after '####': {gsm8k_answer[-80:]!r}")
    gold = _clean(final.replace("$", "").strip())
    if _as_number(gold) is None:
        # Every GSM8K answer is a number; text here would make every response score 0.
        raise ValueError(f"GSM8K answer's final value after '####' is not a number: {final!r}")
    return gold


def _as_number(text: str) -> Decimal | None:
    cleaned = _clean(text.strip().replace("$", "").strip())
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def answers_match(pred: str | None, gold: str) -> bool:
    """Numeric equality when both parse as numbers, else exact (stripped) string equality."""
    if pred is None:
        return False
    pred_num, gold_num = _as_number(pred), _as_number(gold)
    if pred_num is not None and gold_num is not None:
        return pred_num == gold_num
    return pred.strip() == gold.strip()


def score_answers(responses: Sequence[str], golds: Sequence[str]) -> list[float]:
    """1.0 where the number extracted from a response matches its gold answer, else 0.0.

    ``golds`` are already-extracted gold numbers; a raw GSM8K answer field (with
    ``####``) is also accepted and reduced with :func:`gold_answer`.
    """
    if len(responses) != len(golds):
        raise ValueError(
            f"score_answers got {len(responses)} responses but {len(golds)} gold answers"
        )
    scores = []
    for response, gold in zip(responses, golds, strict=True):
        if "####" in gold:
            gold = gold_answer(gold)
        scores.append(1.0 if answers_match(extract_answer(response), gold) else 0.0)
    return scores
