"""One seat trained by TRL's own GRPOTrainer, its completions scored by the game with the
partner's answer inside it (cory_env.seat_reward): prompts replay exactly, the reward is the
game's, and one GRPO step runs on a tiny model on CPU."""

from __future__ import annotations

import pytest

from cory_env import batched_game, custom_task
from cory_env.partners import fixed_partner
from cory_env.seat_reward import SeatReward, seat_prompts
from tests.conftest import make_tiny_tokenizer


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """TRL's trainer sets accelerate's process-wide state (cpu=True), which the project's
    training in a later test of the same process may not change: each test starts and ends
    with none (as accelerate's own test cases do)."""
    from accelerate.state import AcceleratorState, GradientState

    def clear() -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    clear()
    yield
    clear()


def word_count(queries, responses):
    return [len(r.split()) for r in responses]


def chain_prompt(role, query, earlier):
    return " ".join([query.text, *earlier])


def make_game_factory(tokenizer, **settings):
    task = custom_task(["the movie", "a film", "this story"], word_count, prompt_fn=chain_prompt)
    settings = {"max_new_tokens": (2, 4), "role_exchange_period": 1, "lam": 1.0, **settings}
    return lambda: batched_game(task, batch_size=1, tokenizer=tokenizer, **settings)


def test_prompts_replay_and_completions_are_paid_the_game(tiny_tokenizer) -> None:
    make = make_game_factory(tiny_tokenizer)
    partner = fixed_partner("good fun")
    rows = seat_prompts(make, "llm_1", partner, n=4, seed=0)
    assert [r["role"] for r in rows] == ["observer", "pioneer"] * 2  # roles exchange
    assert rows[0]["answers_before"] == ["good fun"] and rows[1]["answers_before"] == []
    assert rows[0]["prompt"].endswith("good fun")
    reward = SeatReward(make, "llm_1", partner)
    columns = {k: [r[k] for r in rows] for k in ("episode", "query", "budget", "answers_before")}
    got = reward([r["prompt"] for r in rows], ["bad", "bad bad", "", "love"], **columns)
    assert got == [3.0, 4.0, 2.0, 3.0]  # own words + lam * the partner's (2)
    assert reward.last_games[1]["responses"] == {"llm_0": "good fun", "llm_1": "bad bad"}
    own = SeatReward(make, "llm_1", partner, reward="score")
    assert own([r["prompt"] for r in rows], ["bad", "bad bad", "", "love"], **columns) == [
        1.0,
        2.0,
        0.0,
        1.0,
    ]
    with pytest.raises(ValueError, match="not the dataset's"):
        reward(["another prompt"], ["bad"], **{k: v[:1] for k, v in columns.items()})
    with pytest.raises(ValueError, match="rounds 1"):
        SeatReward(make_game_factory(tiny_tokenizer, rounds=2), "llm_1", partner)


def test_one_grpo_step_of_trl_on_the_seat(tiny_lm, tmp_path) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tiny_tokenizer = make_tiny_tokenizer()  # its own: TRL wants left padding
    tiny_tokenizer.padding_side = "left"
    make = make_game_factory(tiny_tokenizer, max_new_tokens=4)
    partner = fixed_partner("good fun")
    reward = SeatReward(make, "llm_1", partner)
    rows = seat_prompts(make, "llm_1", partner, n=4, seed=0)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,  # the game's token budget
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tiny_lm,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert f"rewards/{reward.__name__}/mean" in logged
    assert len(reward.last_games) == 4 and all("llm_1" in g["responses"] for g in reward.last_games)


@pytest.mark.slow
def test_the_example_smoke_step_with_the_embedded_model(tmp_path) -> None:
    """examples/trl_seat_grpo.py --smoke: one GRPO step of the embedded model in seat llm_1,
    the embedded model as its partner; the trained model is saved."""
    from pathlib import Path

    from tests.conftest import load_script

    example = load_script(Path(__file__).resolve().parents[1] / "examples/trl_seat_grpo.py")
    (out,) = example.main(["--smoke", "--out", str(tmp_path / "seat")])
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()


def test_the_example_trains_against_an_agent_of_a_run(tiny_model_dir, tmp_path) -> None:
    """--partner RUN:llm_0: the run's agent is exported and answers inside the game."""
    from pathlib import Path

    from cory_rl.train.training.run import run_training
    from tests.conftest import load_script, tiny_config

    run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=1))
    example = load_script(Path(__file__).resolve().parents[1] / "examples/trl_seat_grpo.py")
    partner = f"{tmp_path / 'run'}:llm_0"
    args = [
        "--smoke",
        "--model",
        tiny_model_dir,
        "--partner",
        partner,
        "--out",
        str(tmp_path / "o"),
    ]
    (out,) = example.main(args)
    assert (out / "exported-run" / "llm_0" / "config.json").is_file()
    assert (out / "config.json").is_file()
