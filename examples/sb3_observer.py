"""Stable-Baselines3's PPO takes the observer seat of the small-vocabulary arith game.

The game: one-step problems on operands 1..4 with + and - (``cory_env.SMALL_VOCAB_ARITH``),
one character per token (``cory_env.small_vocab_tokenizer()``, 21 tokens). The pioneer
(``llm_0``) is scripted: it reads ``3+4=`` and answers correctly with probability
``p_correct`` (else a wrong digit), then EOS. The observer (``llm_1``, SB3's PPO with an
MLP) reads ``3+4[7]=``, the reference answer in brackets, and has 2 tokens to answer.
Both are paid the collective reward ``r_pio + r_obs`` (CORY's ``lam=1``); the observer
sees nothing of the answer key, only its prompt. Copying the reference is worth
``p_correct``; working the sum out is worth more. A uniformly random policy scores about
0.05 (computed exactly below).

    python examples/sb3_observer.py --timesteps 16000 --eval-games 400

needs ``pip install -e ".[bridges]"`` (stable-baselines3).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

import cory_env
from cory_env.answer_check import extract_answer, score_answers

SEAT, PIONEER = "llm_1", "llm_0"


def make_env(p_correct: float = 0.8, seed: int = 0, **overrides: Any) -> cory_env.SingleSeatEnv:
    """The observer seat beside a scripted pioneer that is right with probability p_correct."""
    tok = cory_env.small_vocab_tokenizer()
    settings = {
        **cory_env.SMALL_VOCAB_ARITH,
        "role_exchange_period": 10**9,  # llm_0 always pioneers, llm_1 always observes
        **overrides,
    }
    pioneer = cory_env.ArithScriptedPlayer(tok, p_correct=p_correct, seed=seed)
    return cory_env.single_seat(
        "arith", seat=SEAT, others={PIONEER: pioneer}, tokenizer=tok, **settings
    )


def train(
    total_timesteps: int = 16_000, seed: int = 0, p_correct: float = 0.8, n_envs: int = 8
) -> Any:
    """PPO (MultiInputPolicy: the one-hot context window, role and position) on the seat.

    Trains with one torch thread (restored after): for a 64-unit MLP, more threads only
    add synchronisation, and on a busy 2-core machine they make it several times slower.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: make_env(p_correct=p_correct, seed=seed), n_envs=n_envs, seed=seed)
    model = PPO(
        "MultiInputPolicy",
        venv,
        n_steps=64,  # 8 envs x 64 steps = 512 tokens (about 256 games) per update
        batch_size=128,
        n_epochs=4,
        learning_rate=3e-3,
        ent_coef=0.01,
        gamma=1.0,  # the reward comes at the answer's end; no discount inside an answer
        gae_lambda=0.95,
        policy_kwargs={"net_arch": [64, 64]},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return model.learn(total_timesteps)
    finally:
        torch.set_num_threads(threads)


def play(
    act: Callable[[dict[str, Any]], int], n_games: int, seed: int = 1234, p_correct: float = 0.8
) -> dict[str, np.ndarray]:
    """Play ``n_games`` with ``act`` in the observer seat; per-game answer-check scores.

    Returns ``observer`` and ``pioneer`` scores (1 = right answer), ``copied`` (the
    observer's answer equals the pioneer's) and each game's ``answer`` (gold).
    """
    env = make_env(p_correct=p_correct, seed=seed)
    obs, _ = env.reset(seed=seed)
    out: dict[str, list] = {"observer": [], "pioneer": [], "copied": [], "answer": []}
    for game in range(n_games):
        if game:
            obs, _ = env.reset()
        done = False
        while not done:
            obs, _, done, _, info = env.step(act(obs))
        out["observer"].append(info["scores"][SEAT])
        out["pioneer"].append(info["scores"][PIONEER])
        answers = [extract_answer(info["responses"][a]) for a in (SEAT, PIONEER)]
        out["copied"].append(answers[0] is not None and answers[0] == answers[1])
        out["answer"].append(env.game.queries[0].answer)
    return {k: np.asarray(v) for k, v in out.items()}


def sb3_policy(model: Any) -> Callable[[dict[str, Any]], int]:
    return lambda obs: int(model.predict(obs, deterministic=True)[0])


def random_policy(seed: int = 0) -> Callable[[dict[str, Any]], int]:
    rng = np.random.default_rng(seed)
    vocab = len(cory_env.small_vocab_tokenizer())
    return lambda obs: int(rng.integers(vocab))


@cache
def random_success_probability(answer: str, budget: int = 2) -> float:
    """Exact probability that uniformly random tokens score 1 against ``answer``.

    Enumerates every sequence of ``budget`` tokens (vocab ** budget of them; a turn ends
    at the first EOS, as in the game) and scores its decoded text with the task's answer
    checker. It does not depend on the prompt: a random policy ignores it.
    """
    tok = cory_env.small_vocab_tokenizer()
    texts = []
    for seq in itertools.product(range(len(tok)), repeat=budget):
        seq = list(seq)
        if tok.eos_token_id in seq:
            seq = seq[: seq.index(tok.eos_token_id) + 1]
        texts.append(tok.decode(seq, skip_special_tokens=True))
    scores = score_answers(texts, [answer] * len(texts))
    return float(np.mean(scores))


def random_expected_score(budget: int = 2) -> float:
    """A uniformly random observer's expected answer-check score in this game, exactly.

    Games draw their query uniformly from the task's generated queries, so this is the
    mean over those queries of :func:`random_success_probability`.
    """
    task = make_env().game.task
    return float(np.mean([random_success_probability(q.answer, budget) for q in task.queries]))


def hoeffding_margin(n: int, delta: float = 1e-6) -> float:
    """t with P(mean of n i.i.d. [0, 1] scores >= their expectation + t) <= delta.

    Hoeffding: P(mean - mu >= t) <= exp(-2 n t^2), so t = sqrt(ln(1 / delta) / (2 n)).
    """
    return math.sqrt(math.log(1 / delta) / (2 * n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timesteps", type=int, default=16_000)
    parser.add_argument("--eval-games", type=int, default=400)
    parser.add_argument("--p-correct", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    model = train(args.timesteps, seed=args.seed, p_correct=args.p_correct)
    trained_s = time.perf_counter() - start
    sb3 = play(sb3_policy(model), args.eval_games, p_correct=args.p_correct)
    rand = play(random_policy(args.seed), args.eval_games, p_correct=args.p_correct)
    expected = random_expected_score()
    margin = hoeffding_margin(args.eval_games)
    wrong_ref = sb3["pioneer"] == 0
    print(f"trained {args.timesteps} steps in {trained_s:.1f}s")
    print(f"observer score, PPO:    {sb3['observer'].mean():.3f} over {args.eval_games} games")
    print(
        f"observer score, random: {rand['observer'].mean():.3f} (exact expectation {expected:.4f})"
    )
    print(f"pioneer score:          {sb3['pioneer'].mean():.3f} (p_correct {args.p_correct})")
    right_anyway = sb3["observer"][wrong_ref].mean() if wrong_ref.any() else float("nan")
    print(f"PPO copies the reference in {sb3['copied'].mean():.3f} of games; when the reference")
    print(f"  is wrong ({wrong_ref.sum()} games) it is right in {right_anyway:.3f} of them")
    verdict = "yes" if sb3["observer"].mean() >= expected + margin else "no"
    print(f"beats random by the Hoeffding margin {margin:.3f} (delta 1e-6): {verdict}")


if __name__ == "__main__":
    main()
