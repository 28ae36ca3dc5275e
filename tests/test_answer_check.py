"""The paper's answer checker, and the packaged GSM8K fixture recomputed from scratch."""

from __future__ import annotations

import json
import math
import re
from importlib import resources

import pytest

from cory_env.answer_check import answers_match, extract_answer, gold_answer, score_answers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # "the answer is" wins over later numbers, and it is the first number after it
        ("3 + 4 = 7. The answer is 7. Check: 7 * 2 = 14", "7"),
        ("THE ANSWER IS 12 apples, not 15", "12"),
        ("We get 5, so the answer is 8 and then 9", "8"),
        # otherwise the last number in the text
        ("First 12, then 30, finally 42", "42"),
        ("She has 3 apples and buys 4 more, 7 in total.", "7"),
        # thousands separators and trailing dot
        ("The answer is 1,234,567.", "1234567"),
        ("so the total is 2,500.", "2500"),
        ("The answer is $1,000.", "1000"),
        # negatives and decimals
        ("The temperature is 12 - 17 = -5", "-5"),
        ("The answer is -3.", "-3"),
        ("It costs 4.50 dollars", "4.50"),
        ("The answer is 0.25", "0.25"),
        ("the answer is .5", ".5"),
        # a dash glued to a word or number is not a minus sign
        ("from 2019-2020", "2020"),
        # "the answer is" with nothing numeric after it: fall back to the last number
        ("I computed 14. The answer is unknown", "14"),
        # no number at all
        ("I do not know.", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_gold_answer() -> None:
    assert gold_answer("Step one.\nStep <<2*3=6>>6.\n#### 6") == "6"
    assert gold_answer("blah\n#### 1,200") == "1200"
    assert gold_answer("#### -7 ") == "-7"
    assert gold_answer("#### 2.5") == "2.5"
    with pytest.raises(ValueError, match="####"):
        gold_answer("no final line 42")
    with pytest.raises(ValueError, match="nothing after"):
        gold_answer("reasoning\n####   ")


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("1000", "1000", True),
        ("1,000", "1000", True),
        ("1000.0", "1000", True),
        ("1000.00", "1,000", True),
        ("$1,000", "1000", True),
        ("-5", "-5", True),
        ("-5", "5", False),
        ("0.5", ".5", True),
        ("2.5", "2.50", True),
        ("999", "1000", False),
        ("1000.01", "1000", False),
        (None, "1000", False),
        ("seven", "seven", True),  # non-numeric: string equality
        ("seven", "7", False),
        ("nan", "nan", True),  # not finite numbers: compared as strings
    ],
)
def test_answers_match(pred: str | None, gold: str, expected: bool) -> None:
    assert answers_match(pred, gold) is expected


def test_score_answers() -> None:
    responses = ["The answer is 1,000.", "I think 999", "Nothing here", "= -5"]
    assert score_answers(responses, ["1000", "1000", "0", "-5"]) == [1.0, 0.0, 0.0, 1.0]
    # a raw GSM8K answer field is reduced to its gold number
    assert score_answers(["The answer is 72."], ["48+24=<<48+24=72>>72\n#### 72"]) == [1.0]
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        score_answers(["1", "2"], ["1"])


def _fixture_records() -> list[dict[str, str]]:
    path = resources.files("cory_env") / "data" / "gsm8k_sample.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _evaluate(expr: str) -> float:
    assert re.fullmatch(r"[\d.+\-*/() ]+", expr), expr  # plain arithmetic only
    return eval(expr, {"__builtins__": {}})  # noqa: S307 - checked above


def test_gsm8k_fixture_is_correct() -> None:
    records = _fixture_records()
    assert len(records) == 40
    assert len({r["question"] for r in records}) == 40
    decimal_answers = 0
    comma_reasoning = 0
    for r in records:
        assert set(r) == {"question", "answer"}
        reasoning, final = r["answer"].rsplit("\n#### ", 1)
        assert re.fullmatch(r"-?\d+(\.\d+)?", final), final
        calcs = re.findall(r"<<([^=<>]+)=([^<>]+)>>", reasoning)
        assert calcs, r["question"]
        for expr, value in calcs:
            assert math.isclose(_evaluate(expr), float(value)), (expr, value)
        # the final answer is the result of the last calculation
        assert math.isclose(float(calcs[-1][1]), float(final)), r["question"]
        decimal_answers += "." in final
        comma_reasoning += bool(re.search(r"\d,\d{3}", reasoning))
    assert 1 <= decimal_answers <= 2
    assert comma_reasoning >= 3


def test_fixture_gold_round_trip() -> None:
    for r in _fixture_records():
        gold = gold_answer(r["answer"])
        assert score_answers([f"So the answer is {gold}."], [gold]) == [1.0]
