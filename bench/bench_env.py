"""How much the game itself costs next to generating the tokens it is played with.

Plays one batch of the 2-agent imdb game (B=64 by default, a fixed budget of 16 new
tokens) twice: with a random policy (uniform token ids), then with two PPO agents of the
embedded SmolLM2-135M model acting through ``PPOAgent.act`` (KV cache, log-probs and
values recorded, exactly as in training). It measures, with
``time.perf_counter``:

- bookkeeping: time inside the game's ``reset``/``step``/``observe``/``info``, minus the
  reward call made from the last ``step``;
- scoring: time inside ``task.score`` (the one batched reward call per episode);
- generation: the policy's time (for the model: forward passes plus sampling).

and prints both env costs as fractions of the model's generation time (target < 5% each).

    python -m bench.bench_env [--batch-size 64] [--new-tokens 16] [--seed 0] [--threads N]
        [--model embedded] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

import cory_env
from bench import smoke
from cory_rl.agents.policy import build_policies, lm_forward
from cory_rl.agents.ppo import PPOAgent, PPOConfig

TARGET = 0.05
SMOKE = {"model": None, "batch_size": 2, "new_tokens": 3}
"""``--smoke``: both policies on a batch of 2 games of the tiny model."""


class TimedGame:
    """A :class:`cory_env.BatchedTextGame` whose calls and reward scoring are timed."""

    def __init__(self, game: cory_env.BatchedTextGame) -> None:
        self.game = game
        self.seconds: dict[str, float] = defaultdict(float)
        score = game.task.score

        def timed_score(queries: Any, responses: Any) -> list[float]:
            start = time.perf_counter()
            try:
                return score(queries, responses)
            finally:
                self.seconds["score"] += time.perf_counter() - start

        game.task.score = timed_score  # instance attribute shadows the method

    def _timed(self, name: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return getattr(self.game, name)(*args, **kwargs)
        finally:
            self.seconds["env"] += time.perf_counter() - start

    def reset(self, **kwargs: Any) -> None:
        self._timed("reset", **kwargs)

    def step(self, actions: Any, agent: str) -> None:
        self._timed("step", actions, agent=agent)

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        return self._timed("observe", agent)

    def info(self, agent: str) -> dict[str, Any]:
        return self._timed("info", agent)

    @property
    def bookkeeping(self) -> float:
        return self.seconds["env"] - self.seconds["score"]


class RandomPolicy:
    """Uniform token ids."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)

    def __call__(self, agent: str, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.rng.integers(0, self.vocab, size=len(obs["input_ids"]))


class AgentPolicy:
    """The real acting path: one :class:`cory_rl.agents.ppo.PPOAgent` per seat, as training
    runs it."""

    def __init__(self, lm: torch.nn.Module, n_agents: int, pad_token_id: int, seed: int) -> None:
        policies, reference = build_policies(lm, n_agents)
        self.agents = {
            f"llm_{i}": PPOAgent(policy, reference, PPOConfig(), pad_token_id, seed=seed + i)
            for i, policy in enumerate(policies)
        }

    def __call__(self, agent: str, obs: dict[str, np.ndarray]) -> np.ndarray:
        return self.agents[agent].act(obs)


def play(game: TimedGame, policy: Any, seed: int) -> dict[str, float]:
    """Play one episode batch; return the timings and what was generated."""
    generation = 0.0
    game.reset(seed=seed)
    while not game.game.done:
        agent = game.game.agent_selection
        obs = game.observe(agent)
        start = time.perf_counter()
        actions = policy(agent, obs)
        generation += time.perf_counter() - start
        game.step(actions, agent=agent)
    game.info(agent)  # what a logger reads at the end of a batch
    raw = game.game
    tokens = int(sum(game.observe(a)["num_generated"].sum() for a in raw.possible_agents))
    return {
        "bookkeeping": game.bookkeeping,
        "score": game.seconds["score"],
        "generation": generation,
        "tokens": tokens,
        "mean_score": float(np.mean([s.mean() for s in raw.scores.values()])),
    }


def make_game(args: argparse.Namespace, tokenizer: Any) -> TimedGame:
    game = cory_env.batched_game(
        "imdb",
        batch_size=args.batch_size,
        n_agents=2,
        max_new_tokens=args.new_tokens,
        tokenizer=tokenizer,
    )
    return TimedGame(game)


def run(args: argparse.Namespace) -> tuple[dict[str, dict[str, float]], float]:
    """Both policies' timings, and the seconds the model took to load."""
    tokenizer = cory_env.load_tokenizer(args.model)
    start = time.perf_counter()
    lm = cory_env.load_causal_lm(args.model)
    load_s = time.perf_counter() - start
    torch.manual_seed(args.seed)
    with torch.inference_mode():  # warm-up, not timed: first-call allocations
        ids = torch.full((2, 4), tokenizer.eos_token_id)
        lm_forward(lm, ids, torch.ones_like(ids), torch.arange(4).expand(2, 4), keep=1)

    results = {
        "random": play(
            make_game(args, tokenizer), RandomPolicy(len(tokenizer), args.seed), args.seed
        ),
        "model": play(
            make_game(args, tokenizer),
            AgentPolicy(lm, 2, tokenizer.pad_token_id, args.seed),
            args.seed,
        ),
    }
    return results, load_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: leave torch's default); on a machine shared "
        "with other busy processes, 1 avoids OpenMP threads waiting on each other",
    )
    parser.add_argument("--model", default="embedded", help="the policies' model")
    args = smoke.parse_args(parser, argv, SMOKE)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with smoke.model_for(args):
        results, load_s = run(args)
    model_gen = results["model"]["generation"]

    print(
        f"imdb, 2 agents, B={args.batch_size}, max_new_tokens={args.new_tokens}, "
        f"seed={args.seed}, torch threads={torch.get_num_threads()}, "
        f"model load {load_s:.1f}s"
    )
    header = (
        f"{'policy':<8}{'generation s':>14}{'bookkeeping s':>15}{'scoring s':>11}"
        f"{'book/gen':>10}{'score/gen':>11}{'tokens':>8}{'gen tok/s':>11}{'all tok/s':>11}"
        f"{'mean score':>12}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        total = r["generation"] + r["bookkeeping"] + r["score"]
        print(
            f"{name:<8}{r['generation']:>14.4f}{r['bookkeeping']:>15.4f}{r['score']:>11.4f}"
            f"{r['bookkeeping'] / model_gen:>10.2%}{r['score'] / model_gen:>11.2%}"
            f"{r['tokens']:>8d}{r['tokens'] / r['generation']:>11.1f}{r['tokens'] / total:>11.1f}"
            f"{r['mean_score']:>12.3f}"
        )
    print(
        "book/gen and score/gen divide by the model's generation time "
        f"({model_gen:.2f}s); gen tok/s = tokens / generation s, all tok/s = tokens / "
        "(generation + bookkeeping + scoring) s; tokens = new tokens kept by the game."
    )
    m = results["model"]
    for label, value in (("bookkeeping", m["bookkeeping"]), ("scoring", m["score"])):
        ratio = value / model_gen
        verdict = "ok" if ratio < TARGET else "ABOVE TARGET"
        print(f"{label}/generation = {ratio:.2%} (target < {TARGET:.0%}): {verdict}")


if __name__ == "__main__":
    main()
