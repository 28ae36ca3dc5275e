"""Each KL penalty form's gradient against the exact gradient of E[R - beta * KL].

A game small enough to enumerate: two tokens and EOS, answers of at most three tokens, a
tabular policy (one row of logits per answer prefix) and a tabular reference. The exact
gradient of J = sum_y pi(y) (R(y) - beta * sum_t KL(pi(.|s_t) || pi_ref(.|s_t))) comes
from enumerating every answer; each form's gradient is the REINFORCE estimate built from
the library's own pieces (``agents/kl_penalty.py`` for the reward and loss parts,
``agents/ppo_math.py``'s ``token_rewards``, ``agents/pg_math.py``'s returns), averaged
over many sampled answers, with its standard error. An exact form agrees with the exact
gradient within sampling error; a fidelity form shows its bias.

    python -m bench.kl_gradient            # the table of docs/learners.md
    python -m bench.kl_gradient --smoke    # fewer samples
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch

from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import pg_math as pg
from cory_rl.agents import ppo_math as pm

EOS = 2
VOCAB = 3
MAX_LEN = 3


@dataclass
class TabularGame:
    """A policy and a reference as one row of logits per answer prefix, and a reward per
    answer; prefixes are the token tuples without EOS shorter than ``MAX_LEN``."""

    theta: torch.Tensor
    """(n_states, VOCAB) the policy's logits, with gradient."""
    ref_logits: torch.Tensor
    """(n_states, VOCAB) the reference's logits."""
    reward: dict[tuple[int, ...], float]
    """R(y) for every answer y."""
    states: dict[tuple[int, ...], int]
    """The row of each prefix."""

    @classmethod
    def random(cls, seed: int = 0) -> TabularGame:
        g = torch.Generator().manual_seed(seed)
        prefixes = [p for n in range(MAX_LEN) for p in itertools.product(range(EOS), repeat=n)]
        states = {p: i for i, p in enumerate(prefixes)}
        theta = torch.randn(len(prefixes), VOCAB, generator=g, dtype=torch.float64)
        ref = torch.randn(len(prefixes), VOCAB, generator=g, dtype=torch.float64)
        answers = list(all_answers())
        rewards = torch.rand(len(answers), generator=g, dtype=torch.float64)
        reward = {y: float(r) for y, r in zip(answers, rewards, strict=True)}
        return cls(theta.requires_grad_(True), ref, reward, states)


def all_answers() -> list[tuple[int, ...]]:
    """Every answer: ends with EOS, or at ``MAX_LEN`` tokens without one."""
    answers = []
    for n in range(1, MAX_LEN + 1):
        for body in itertools.product(range(EOS), repeat=n - 1):
            answers.append((*body, EOS))
        if n == MAX_LEN:
            answers.extend(itertools.product(range(EOS), repeat=n))
    return answers


def exact_gradient(game: TabularGame, beta: float) -> torch.Tensor:
    """grad_theta of sum_y pi(y) (R(y) - beta * sum_t KL_t(s_t)), by enumeration."""
    logp = torch.log_softmax(game.theta, dim=-1)
    logq = torch.log_softmax(game.ref_logits, dim=-1)
    state_kl = (logp.exp() * (logp - logq)).sum(dim=-1)
    objective = torch.zeros((), dtype=torch.float64)
    for y in all_answers():
        rows = [game.states[y[:t]] for t in range(len(y))]
        log_prob = sum(logp[s, tok] for s, tok in zip(rows, y, strict=True))
        kl = sum(state_kl[s] for s in rows)
        objective = objective + log_prob.exp() * (game.reward[y] - beta * kl)
    (grad,) = torch.autograd.grad(objective, game.theta)
    return grad


def answer_key(length: int, code: int, ended: bool) -> tuple[int, int, int]:
    """An answer as (tokens before EOS, their binary code, whether EOS ended it)."""
    return length, code, int(ended)


def sample(
    game: TabularGame, n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` answers drawn from the policy: tokens, mask and state rows (n, MAX_LEN), and
    their rewards (n,). A prefix of length l and binary code c is state 2^l - 1 + c (the
    order of ``TabularGame.random``'s prefixes)."""
    probs = torch.softmax(game.theta.detach(), dim=-1)
    tokens = torch.zeros(n, MAX_LEN, dtype=torch.long)
    rows = torch.zeros(n, MAX_LEN, dtype=torch.long)
    mask = torch.zeros(n, MAX_LEN)
    length = torch.zeros(n, dtype=torch.long)
    code = torch.zeros(n, dtype=torch.long)
    alive = torch.ones(n, dtype=torch.bool)
    ended = torch.zeros(n, dtype=torch.bool)
    for t in range(MAX_LEN):
        state = (2**length - 1 + code).clamp(max=len(game.states) - 1)
        drawn = torch.multinomial(probs[state], 1, generator=generator).squeeze(1)
        tokens[:, t] = torch.where(alive, drawn, 0)
        rows[:, t] = state
        mask[:, t] = alive.float()
        grows = alive & (drawn != EOS)
        ended |= alive & (drawn == EOS)
        code = torch.where(grows, 2 * code + drawn, code)
        length = length + grows.long()
        alive = grows
    grid = torch.zeros(MAX_LEN + 1, 2**MAX_LEN, 2, dtype=torch.float64)
    for y in all_answers():
        body = [tok for tok in y if tok != EOS]
        grid[answer_key(len(body), int("".join(map(str, body)) or "0", 2), y[-1] == EOS)] = (
            game.reward[y]
        )
    rewards = grid[length, code, ended.long()]
    return tokens, mask, rows, rewards


def estimated_gradient(
    game: TabularGame, penalty: str, beta: float, n: int, batches: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of ``batches`` REINFORCE estimates of grad J (``n`` answers each) with the
    ``penalty`` form, and its standard error, element by element."""
    generator = torch.Generator().manual_seed(seed)
    estimates = []
    for _ in range(batches):
        tokens, mask, rows, scores = sample(game, n, generator)
        logits = game.theta[rows]  # (n, T, V), with gradient
        logp_full = torch.log_softmax(logits, dim=-1)
        ref_full = torch.log_softmax(game.ref_logits[rows], dim=-1)
        logp = logp_full.gather(-1, tokens[..., None]).squeeze(-1)
        ref_logp = ref_full.gather(-1, tokens[..., None]).squeeze(-1)
        kl = kp.measured(penalty, logp.detach(), ref_logp, logp_full.detach(), ref_full) * mask
        rewards, _ = pm.token_rewards(scores, kp.reward_part(penalty, kl), mask, beta)
        returns = pg.returns_to_go(rewards, mask, 1.0)
        surrogate = -(logp * returns.detach() * mask).sum(dim=1).mean()
        part = kp.loss_part(penalty, logits, logp, ref_logp, ref_full)
        if part is not None:
            weight = kp.loss_weight(penalty, beta, 1.0).to(part.dtype)
            surrogate = surrogate + (weight * part * mask).sum(dim=1).mean()
        (grad,) = torch.autograd.grad(surrogate, game.theta)
        estimates.append(-grad)  # the surrogate is minimised: its negative ascends J
    stacked = torch.stack(estimates)
    return stacked.mean(dim=0), stacked.std(dim=0) / batches**0.5


def compare(
    penalty: str, beta: float = 1.0, n: int = 4000, batches: int = 50, seed: int = 0
) -> dict[str, float]:
    """A form's gradient beside the exact one: the relative bias ||E g - grad J|| /
    ||grad J|| and the largest |z| of an element's difference over its standard error."""
    game = TabularGame.random(seed)
    exact = exact_gradient(game, beta)
    mean, se = estimated_gradient(game, penalty, beta, n, batches, seed + 1)
    diff = mean - exact
    return {
        "relative_bias": float(diff.norm() / exact.norm()),
        "max_abs_z": float((diff.abs() / se.clamp(min=1e-12)).max()),
        "relative_se": float(se.norm() / exact.norm()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="fewer samples (seconds)")
    parser.add_argument("--beta", type=float, default=1.0, help="the KL coefficient")
    parser.add_argument("--seed", type=int, default=0, help="the game's and the draws' seed")
    args = parser.parse_args()
    n, batches = (500, 10) if args.smoke else (4000, 100)
    print(f"beta {args.beta}, seed {args.seed}, {batches} x {n} answers per form")
    print(f"{'form':16} {'kind':9} {'relative bias':>14} {'its s.e.':>9} {'max |z|':>8}")
    for name, form in kp.FORMS.items():
        r = compare(name, args.beta, n, batches, args.seed)
        kind = "exact" if form.exact else "fidelity"
        print(
            f"{name:16} {kind:9} {r['relative_bias']:14.3f} {r['relative_se']:9.3f} "
            f"{r['max_abs_z']:8.1f}"
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
