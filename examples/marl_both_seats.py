"""TorchRL trains both seats of the small-vocabulary arith game through its PettingZoo wrapper.

The game is ``cory_env.text_game`` (the PettingZoo AEC env) with the character-level
tokenizer and ``cory_env.SMALL_VOCAB_ARITH``: the pioneer reads ``3+4=``, the observer
``3+4[7]=``; each has 2 tokens to answer; both are paid the collective reward
``r_pio + r_obs`` (1 per right answer), and roles exchange every ``role_exchange_period``
games, so each seat's policy must play both roles.

TorchRL's ``PettingZooWrapper(use_mask=True)`` turns the AEC env into TensorDicts with one
group per agent (``llm_0``, ``llm_1``) and a ``mask`` saying who acts. Each group has its
own MLP policy and critic (``ProbabilisticActor``, ``ValueOperator``), TorchRL's
``Collector`` plays the games, its ``GAE`` computes advantages and its
``ClipPPOLoss`` updates each seat on the steps where it acted.

TorchRL stores infos as tensors, so the AEC env's text infos (query, answers) are
replaced by a numeric one (:class:`NumericInfos`): each seat's answer-check score, 0 until
the game ends.

The default game is the small one made easier still (:data:`EASY`: operands 1..2, so
answers 0..4, and a one-token answer, so no EOS to learn), where both seats learn in
about 2400 frames (1200 games, ~15 s on 2 cores); ``--game small`` plays
``SMALL_VOCAB_ARITH`` as it is (2-token answers, operands 1..4), which needs far more
frames: TorchRL's PettingZoo wrapper costs a few milliseconds per token.

    python examples/marl_both_seats.py                 # EASY, 2400 frames
    python examples/marl_both_seats.py --game small --frames 40000

needs ``pip install -e ".[bridges]"`` (torchrl).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch
from pettingzoo.utils import BaseWrapper
from torch import nn
from torchrl.modules import MLP

import cory_env

AGENTS = ("llm_0", "llm_1")
EASY = {"max_operand": 2, "max_new_tokens": 1}
"""Overrides of ``SMALL_VOCAB_ARITH`` for the quick game: 7 distinct problems, one-digit
answers 0..4 given as one token. A uniformly random token is right with probability
exactly 1/21 (one of the 21 tokens is the answer's digit)."""
GAMES = {"easy": EASY, "small": {}}


class NumericInfos(BaseWrapper):
    """The AEC env with numeric infos only (TorchRL turns each info entry into a tensor).

    ``info["score"]``: the agent's own task score once the game is over, else 0.
    """

    @property
    def infos(self) -> dict[str, dict[str, float]]:
        return {
            agent: {"score": float(info["scores"].get(agent, 0.0))}
            for agent, info in self.env.infos.items()
        }


def make_env(seed: int = 0, role_exchange_period: int = 1, **overrides: Any) -> Any:
    """The small-vocabulary arith AEC env wrapped by TorchRL (one group per agent)."""
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    class Wrapper(PettingZooWrapper):
        # TorchRL forwards unknown attributes to the PettingZoo env through a __getattr__
        # that lists the module's attributes each time; the three read on every step are
        # forwarded directly here (same values, about 15% less time per step).
        agent_selection = property(lambda self: self._env.agent_selection)
        agents = property(lambda self: self._env.agents)
        possible_agents = property(lambda self: self._env.possible_agents)

    settings = {
        **cory_env.SMALL_VOCAB_ARITH,
        "role_exchange_period": role_exchange_period,
        **overrides,
    }
    aec = cory_env.text_game("arith", tokenizer=cory_env.small_vocab_tokenizer(), **settings)
    return Wrapper(NumericInfos(aec), use_mask=True, categorical_actions=True, seed=seed)


class Features(nn.Module):
    """One-hot context window, one-hot position in the answer and one-hot role, as floats."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(
        self, input_ids: torch.Tensor, num_generated: torch.Tensor, role: torch.Tensor
    ) -> torch.Tensor:
        ids = nn.functional.one_hot(input_ids.long(), self.vocab).flatten(-2)
        return torch.cat([ids.float(), num_generated.float(), role.float()], dim=-1)


class Scorer(nn.Module):
    """:class:`Features` then an MLP: logits (``out`` = vocab) or a value (``out`` = 1)."""

    def __init__(self, vocab: int, out: int, hidden: int) -> None:
        super().__init__()
        self.features = Features(vocab)
        self.mlp = MLP(out_features=out, num_cells=[hidden, hidden], activation_class=nn.Tanh)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.features(*inputs))


def make_agent(env: Any, group: str, hidden: int = 64) -> tuple[Any, Any]:
    """A policy (``ProbabilisticActor``) and a critic (``ValueOperator``) for one group."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor, ValueOperator

    vocab = int(env.full_action_spec[group, "action"].space.n)
    obs = (group, "observation")
    in_keys = [(*obs, "input_ids"), (*obs, "num_generated"), (*obs, "role")]
    policy = ProbabilisticActor(
        TensorDictModule(Scorer(vocab, vocab, hidden), in_keys, [(group, "logits")]),
        in_keys={"logits": (group, "logits")},
        out_keys=[(group, "action")],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=(group, "log_prob"),
    )
    critic = ValueOperator(Scorer(vocab, 1, hidden), in_keys, [(group, "state_value")])
    return policy, critic


def make_losses(policies: dict, critics: dict, entropy: float = 0.01) -> dict[str, Any]:
    """A ``ClipPPOLoss`` per group, reading that group's keys, with GAE (gamma 1, lambda 1)."""
    from torchrl.objectives import ClipPPOLoss, ValueEstimators

    losses = {}
    for group in policies:
        loss = ClipPPOLoss(
            actor_network=policies[group],
            critic_network=critics[group],
            clip_epsilon=0.2,
            entropy_coeff=entropy,
            normalize_advantage=True,
        )
        loss.set_keys(
            reward=(group, "reward"),
            action=(group, "action"),
            sample_log_prob=(group, "log_prob"),
            value=(group, "state_value"),
            advantage=(group, "advantage"),
            value_target=(group, "value_target"),
            done=(group, "done"),
            terminated=(group, "terminated"),
        )
        # lmbda=1: Monte Carlo advantages (return - V(s)). A seat's critic is trained only
        # where it acts, so its estimates at other seats' steps must not leak in.
        loss.make_value_estimator(ValueEstimators.GAE, gamma=1.0, lmbda=1.0)
        losses[group] = loss
    return losses


def game_scores(data: Any) -> dict[str, np.ndarray]:
    """Each seat's answer-check score in every game that ended inside ``data``."""
    ended = data["next", "done"].reshape(-1)
    return {g: data["next", g, "info", "score"].reshape(-1)[ended].numpy() for g in AGENTS}


def train(
    frames: int = 2400,
    frames_per_batch: int = 600,
    seed: int = 0,
    epochs: int = 8,
    minibatch: int = 200,
    lr: float = 1e-2,
    **settings: Any,
) -> dict[str, Any]:
    """Train both seats with TorchRL; returns the policies, critics and a per-batch log.

    ``settings`` override the game's (e.g. :data:`EASY`).

    ``log`` has, per collected batch, each seat's mean score in the games that ended in it
    (as played by the policy being trained, with sampling), and the parameters before
    training are kept under ``initial`` so that a caller can check both seats changed.
    """
    from torchrl.collectors import Collector

    torch.manual_seed(seed)
    env = make_env(seed=seed, **settings)
    policies, critics = {}, {}
    for group in AGENTS:
        policies[group], critics[group] = make_agent(env, group)
        policies[group](env.reset())  # materialise lazy layers
        critics[group](env.reset())
    initial = {g: [p.detach().clone() for p in policies[g].parameters()] for g in AGENTS}
    from tensordict.nn import TensorDictSequential

    joint = TensorDictSequential(*policies.values())
    losses = make_losses(policies, critics)
    optims = {g: torch.optim.Adam(losses[g].parameters(), lr=lr) for g in AGENTS}
    collector = Collector(
        env,
        joint,
        frames_per_batch=frames_per_batch,
        total_frames=frames,
        device="cpu",
        auto_register_policy_transforms=False,  # the MLPs keep no recurrent state
    )
    log: dict[str, list] = {g: [] for g in AGENTS}
    log["updates"] = {g: 0 for g in AGENTS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small MLPs: extra threads only cost synchronisation
    try:
        _run(collector, losses, optims, log, epochs, minibatch)
    finally:
        torch.set_num_threads(threads)
        collector.shutdown()
    return {"policies": policies, "critics": critics, "initial": initial, "log": log}


def _run(
    collector: Any, losses: dict, optims: dict, log: dict, epochs: int, minibatch: int
) -> None:
    """PPO epochs per collected batch, each seat on the steps where it acted."""
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    with set_exploration_type(ExplorationType.RANDOM):
        for data in collector:
            for g, s in game_scores(data).items():
                log[g].append(float(s.mean()) if len(s) else float("nan"))
            for g in AGENTS:
                # The group's done/terminated cover the game's end; the reward of a seat
                # arrives at the game's last step, often another seat's step.
                with torch.no_grad():
                    losses[g].value_estimator(
                        data,
                        params=losses[g].critic_network_params,
                        target_params=losses[g].target_critic_network_params,
                    )
                acted = data[g, "mask"].reshape(-1)
                mine = data.reshape(-1)[acted]  # only the steps where this seat acted
                for _ in range(epochs):
                    for idx in torch.randperm(len(mine)).split(minibatch):
                        parts = losses[g](mine[idx])
                        total = parts["loss_objective"] + parts["loss_critic"]
                        total = total + parts.get("loss_entropy", torch.zeros(()))
                        optims[g].zero_grad()
                        total.backward()
                        nn.utils.clip_grad_norm_(losses[g].parameters(), 1.0)
                        optims[g].step()
                        log["updates"][g] += 1


def evaluate(
    policies: dict | None, games: int = 200, seed: int = 1, **settings: Any
) -> dict[str, np.ndarray]:
    """Play ``games`` games through TorchRL (``env.rollout``); each seat's scores.

    ``policies=None`` plays uniformly random tokens (TorchRL's random action).
    """
    from tensordict.nn import TensorDictSequential
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    env = make_env(seed=seed, **settings)
    scores: dict[str, list] = {g: [] for g in AGENTS}
    policy = None if policies is None else TensorDictSequential(*policies.values())
    with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        while len(scores[AGENTS[0]]) < games:
            data = env.rollout(400, policy, break_when_any_done=False)
            for g, s in game_scores(data).items():
                scores[g].extend(s.tolist())
    return {g: np.asarray(v[:games]) for g, v in scores.items()}


def kl_bernoulli(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p))."""
    terms = [(q, p), (1 - q, 1 - p)]
    return sum(a * math.log(a / b) for a, b in terms if a > 0)


def chance_threshold(p0: float, n: int, delta: float = 1e-6) -> float:
    """The smallest mean score that n i.i.d. {0, 1} scores of mean <= p0 reach with
    probability <= delta, by the Chernoff-Hoeffding bound P(mean >= q) <= exp(-n KL(q||p0))
    (for q > p0); found by bisection."""
    low, high = p0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if n * kl_bernoulli(mid, p0) < math.log(1 / delta) else (low, mid)
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", choices=sorted(GAMES), default="easy")
    parser.add_argument("--frames", type=int, default=2400)
    parser.add_argument("--eval-games", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = GAMES[args.game]
    start = time.perf_counter()
    out = train(args.frames, seed=args.seed, **settings)
    print(f"trained on {args.frames} frames in {time.perf_counter() - start:.1f}s")
    for g in AGENTS:
        curve = " ".join(f"{x:.2f}" for x in out["log"][g])
        print(f"{g} score per batch: {curve}")
    trained = evaluate(out["policies"], args.eval_games, **settings)
    rand = evaluate(None, args.eval_games, **settings)
    for g in AGENTS:
        print(f"{g}: trained {trained[g].mean():.3f}, random {rand[g].mean():.3f}")
    if args.game == "easy":
        bar = chance_threshold(1 / 21, args.eval_games)
        print(f"random is right with probability 1/21; above {bar:.3f} is beyond chance")


if __name__ == "__main__":
    main()
