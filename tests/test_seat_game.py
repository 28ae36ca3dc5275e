"""One seat of the turn-level game against partners inside it (cory_env.seat_game,
cory_env.partners): the seat's pay is the game's, whatever its role."""

from __future__ import annotations

import pytest

from cory_env import batched_game, custom_task
from cory_env.partners import fixed_partner, model_partner
from cory_env.seat_game import SeatGame


def word_count(queries, responses):
    return [len(r.split()) for r in responses]


def chain_prompt(role, query, earlier):
    return " ".join([query.text, *earlier])


def game(tokenizer, **settings):
    task = custom_task(["the movie", "a film"], word_count, name="words", prompt_fn=chain_prompt)
    settings = {"max_new_tokens": 4, "role_exchange_period": 1, **settings}
    return batched_game(task, batch_size=1, tokenizer=tokenizer, **settings)


@pytest.mark.parametrize("lam", [1.0, 0.0])
def test_seat_is_paid_the_game_in_either_role(tiny_tokenizer, lam) -> None:
    seat = SeatGame(game(tiny_tokenizer, lam=lam), "llm_1", fixed_partner("good fun bad"))
    for episode in range(2):  # llm_1 observes, then leads
        first = seat.reset(seed=0, options={"episode": episode})
        assert not first.done and first.reward == 0.0
        role = first.info["roles"]["llm_1"]
        if role == "observer":
            assert first.prompt.endswith("good fun bad")  # it sees the pioneer's answer
        last = seat.step("great")
        assert last.done and last.prompt == ""
        assert last.reward == pytest.approx(1 + lam * 3)
        assert last.info["responses"] == {"llm_0": "good fun bad", "llm_1": "great"}
    assert {role, first.info["roles"]["llm_1"]} == {"pioneer"}


def test_rounds_pay_per_round_and_score_variant(tiny_tokenizer) -> None:
    g = game(tiny_tokenizer, rounds=2, pay_every_round=True, lam=1.0)
    seat = SeatGame(g, "llm_0", {"llm_1": fixed_partner("bad")})
    seat.reset(seed=0, options={"episode": 0})
    mid = seat.step("good fun")
    assert not mid.done and mid.reward == 3.0 and "good fun bad" in mid.prompt
    assert seat.step("good").reward == 2.0
    scored = SeatGame(game(tiny_tokenizer), "llm_0", fixed_partner("bad"), reward="score")
    scored.reset(seed=0, options={"episode": 0})
    assert scored.step("good fun").reward == 2.0


def test_answers_before_replay_the_recorded_prompt(tiny_tokenizer) -> None:
    seat = SeatGame(game(tiny_tokenizer), "llm_1", fixed_partner("fun"))
    options = {"episode": 0, "queries": [1], "budgets": [4]}
    prompt = seat.reset(options=options).prompt
    replayed = seat.reset(options=options, answers_before=["fun"]).prompt
    assert replayed == prompt == "a film fun"
    with pytest.raises(ValueError, match="more than turns"):
        seat.reset(options=options, answers_before=["fun", "extra"])


def test_bad_partners_and_seats_refused(tiny_tokenizer) -> None:
    with pytest.raises(KeyError, match="unknown seat"):
        SeatGame(game(tiny_tokenizer), "llm_5", fixed_partner("x"))
    with pytest.raises(ValueError, match="missing \\['llm_1'\\]"):
        SeatGame(game(tiny_tokenizer), "llm_0", {})
    with pytest.raises(ValueError, match="not another seat \\['llm_0'\\]"):
        SeatGame(game(tiny_tokenizer), "llm_0", {"llm_0": str, "llm_1": str})


def test_model_partner_from_a_folder(tiny_model_dir, tmp_path) -> None:
    partner = model_partner(tiny_model_dir, max_new_tokens=3)
    answer = partner("the movie")
    assert isinstance(answer, str) and partner("the movie") == answer  # greedy: cached
    assert isinstance(partner(""), str)  # an empty prompt (a query of unknown words) too
    seat = SeatGame(game(partner.tokenizer), "llm_1", partner)
    first = seat.reset(seed=0, options={"episode": 0})
    query = first.info["query"]
    assert first.prompt == f"{query} {partner(query)}"  # the pioneer partner answered the query
    (tmp_path / "config.yaml").write_text("model: x\n")
    with pytest.raises(ValueError, match="export its agents first"):
        model_partner(tmp_path)
