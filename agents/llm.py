"""The base of every LLM learner: its settings (:class:`LLMConfig`), its turns and
rollouts, and the frame of an update. A learner built on it supplies ``learn`` (its
advantages and its loss) and its own settings.

:class:`LLMLearner` is composed of parts that each own their state and take what else
they use as arguments: the optimisation (policy, Adam, shuffle; ``agents/update.py``,
which also steps a loss over mini-batches), the token sampler (``llm_acting.py``, with
the token-by-token acting step), the reward shaping (reference, KL controller, score
scaling; ``llm_reference.py``) and the seat on a rollout engine (``llm_engine_seat.py``).
Save and load are functions of those parts (``llm_state.py``).

Acting goes token by token with a KV cache, recording each sampled token's log-prob and
the value as it goes, so a rollout costs no more than ``generate()``. The model plumbing
(value head, reference, LoRA sharing) is in ``agents/policy.py``; the RL math, each term
checked against hand-computed values, in ``agents/ppo_math.py`` and ``agents/pg_math.py``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from cory_env import checks
from cory_rl.agents import kl_penalty as kp
from cory_rl.agents import llm_state, state_io, turns
from cory_rl.agents import ppo_math as pm
from cory_rl.agents.base import Learner
from cory_rl.agents.engine import RolloutEngine
from cory_rl.agents.export import export_policy
from cory_rl.agents.llm_acting import TokenSampler, next_token
from cory_rl.agents.llm_config import LLMConfig
from cory_rl.agents.llm_engine_seat import EngineSeat, engine_logprobs
from cory_rl.agents.llm_probe import Probe
from cory_rl.agents.llm_reference import RewardShaping, ShapedRollout
from cory_rl.agents.policy import PolicyWithValue, Reference
from cory_rl.agents.rollout import Rollout, Turn, concat_rollouts
from cory_rl.agents.update import LossFn, Optimisation, minibatch_update


# ----------------------------------------------------------------------------- learner
class LLMLearner(Learner):
    """An LLM playing one seat (a :class:`cory_rl.agents.base.Learner`); subclasses add
    ``learn``.

    It is made of parts that each own their state and are handed what else they use:

    - ``optimisation`` (:class:`cory_rl.agents.update.Optimisation`): the policy, Adam,
      the step inside the backward pass, the mini-batches' shuffle and the sharding;
    - ``sampler`` (:class:`cory_rl.agents.llm_acting.TokenSampler`): the sampling
      distribution, the sampling generator and common random numbers;
    - ``shaping`` (:class:`cory_rl.agents.llm_reference.RewardShaping`): the reference,
      the KL controller and the score statistics;
    - ``engine_seat`` (:class:`cory_rl.agents.llm_engine_seat.EngineSeat`): a rollout
      engine, if attached, and the gaps between its log-probs and the learner's.

    The learner itself keeps the turn being played, the rollout collected, the version of
    its weights and its probe. ``learn`` reads as: :meth:`start_update` (the rollout, its
    KL to the reference and its scaled scores), the learner's own advantages and loss,
    :meth:`update` (``agents/update.py``), :meth:`finish` (the KL controller and the
    statistics every learner reports).

    ``has_critic = False`` freezes the value head: acting still computes it and checkpoints
    keep it, but no loss uses it, so it never moves. Without LoRA it is also out of the
    optimiser; with LoRA ``PolicyWithValue.trainable_parameters`` lists it regardless, and
    it sits there with no gradient, so Adam neither keeps state for it nor updates it.
    """

    name = "llm"
    """The registered name, written into the agent's checkpoint."""
    has_critic = True
    can_restart = True
    takes_engine = True
    multi_turn = True
    takes_sampling_noise = True
    exportable = True

    def __init__(
        self,
        policy: PolicyWithValue,
        reference: Reference,
        config: LLMConfig,
        pad_token_id: int,
        accelerator: Any = None,
        seed: int = 0,
    ) -> None:
        from accelerate import Accelerator

        config.validate()
        if config.share_prompt_prefix and policy.sharding is not None:
            raise checks.SettingError(
                "share_prompt_prefix runs a shared prompt beginning as a forward of its own, "
                "which sharded policies (FSDP2) have not been checked with; set it false, or "
                "sharding none"
            )
        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.device = self.accelerator.device
        self.pad_token_id = pad_token_id
        if not self.has_critic:
            policy.value_head.requires_grad_(False)
        policy.to(self.device).eval()  # dropout stays off: the PPO ratio compares one function
        autocast = self.accelerator.autocast
        self.optimisation = Optimisation(
            policy, config.learning_rate, self.accelerator, shuffle_seed=seed + 1
        )
        self.shaping = RewardShaping(reference, config, self.device, autocast)
        self.sampler = TokenSampler(config, self.device, seed)
        self.engine_seat = EngineSeat(config, self.device, autocast)
        self.turn: Turn | None = None
        """The turn being played (None between turns); read by the benchmark."""
        self.rollout: Rollout | None = None
        """The rollout collected since the last update (None = nothing yet)."""
        self.closed_turns: list[Rollout] = []
        """In a game of several rounds or seats, this episode's turns so far
        (:meth:`end_turn`), and the role each was played in."""
        self.closed_roles: list[int] = []
        self.last_turns: dict[int, Turn] = {}
        """In several seats: each role's last turn (what :meth:`turn_stats` reads)."""
        self.role_noise: dict[int, np.ndarray] = {}
        """Common random numbers per role (:meth:`use_sampling_noise` with a role)."""
        self.weights_version = 0
        """Counts changes of the weights (updates, loads, resets); an engine reloads them
        when it differs from the version it holds."""
        self.probe = Probe()

    # ------------------------------------------------------------------ read by others
    @property
    def model(self) -> PolicyWithValue:
        """The policy, without accelerate's wrapper."""
        return self.optimisation.model

    @property
    def policy(self) -> Any:
        """The policy as the update calls it (accelerate's wrapper); read by ``bench/``."""
        return self.optimisation.policy

    @property
    def optimizer(self) -> Any:
        """The policy's Adam; read by ``bench/``."""
        return self.optimisation.optimizer

    @property
    def reference(self) -> Reference:
        """The frozen reference; read by ``bench/``."""
        return self.shaping.reference

    @property
    def sharding(self) -> Any:  # the Learner capability
        return self.optimisation.sharding

    def watch(self, name: str, **info: Any) -> contextlib.AbstractContextManager[Any]:
        """The probe's phase ``name`` of this learner (what the parts run their work in)."""
        return self.probe.phase(name, self, **info)

    # ------------------------------------------------------------------ acting
    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Sample one token per row, reusing the KV cache within a turn; at a turn's first
        token, a rollout engine (if attached) plans the whole turn."""
        with self.watch("act", obs=obs), torch.no_grad():
            generated = np.asarray(obs["num_generated"])
            if (generated == 0).all():
                self.turn = Turn.start(obs, self.device)
                if self.role_noise:  # common noise per role: this seat's
                    self.sampler.use_noise(self.role_noise.get(self.turn.role))
                if self.seats > 1:  # each seat's last turn, for turn_stats
                    self.last_turns[self.turn.role] = self.turn
                self.optimisation.gather_weights()  # sharded: held until turn_over()
                if self.engine_seat.engine is not None and self.sampler.noise is None:
                    self.engine_seat.plan_turn(
                        self.turn, obs, self.model, self.sampler, self.weights_version
                    )
            exact_kl = kp.needs_full_logprobs(self.config.kl_penalty)
            return next_token(
                self.turn, generated, self.model, self.sampler, self.accelerator.autocast, exact_kl
            )

    def use_sampling_noise(self, noise: np.ndarray | None, role: int | None = None) -> None:
        """Draw each token with the given uniforms until called with None
        (:meth:`cory_rl.agents.llm_acting.TokenSampler.use_noise`); with ``role``, in the
        turns of that role only (a learner in several seats draws each seat's own)."""
        if role is None:
            self.role_noise = {}
            self.sampler.use_noise(noise)
        elif noise is None:
            self.role_noise.pop(int(role), None)
        else:
            self.sampler.use_noise(noise)  # checked now, used from the role's next turn
            self.role_noise[int(role)] = self.sampler.noise

    def attach_engine(self, engine: RolloutEngine | None, eos_token_id: int) -> None:
        """Take whole turns from ``engine`` (None: act token by token again)."""
        self.engine_seat.attach(engine, eos_token_id)

    def turn_over(self) -> None:
        """The game moved on from this seat's turn: free the weights gathered for it, and
        its KV cache (what is kept of the turn, to learn from or report, needs neither)."""
        self.optimisation.release_weights()
        if self.turn is not None:
            self.turn.cache = None

    def end_turn(self, num_generated: np.ndarray) -> None:
        """In a game of several rounds, or in several seats: keep the turn that ended (its
        ``num_generated`` tokens per row accepted) until the rewards come
        (:meth:`end_rollout`)."""
        self.closed_turns.append(self._close_turn(num_generated, np.zeros(len(num_generated))))
        self.closed_roles.append(self.turn.role)
        self.turn = None

    def end_rollout(self, obs: dict[str, np.ndarray], rewards: np.ndarray) -> None:
        """Keep the finished turn, or in a game of several rounds the turns :meth:`end_turn`
        kept with their rewards ``(B, rounds)``, for :meth:`learn`."""
        with self.watch("end_rollout", obs=obs):
            rewards = np.asarray(rewards)
            if rewards.ndim == 2:
                self.rollout = self._episodes_rollout(rewards)
            else:
                self.rollout = self.empty_answers(self._close_turn(obs["num_generated"], rewards))
        self.turn = None

    def empty_answers(self, rollout: Rollout) -> Rollout:
        """What becomes of a game of one turn in which this seat accepted no token (a
        refereed match over before its turn): left out of the update
        (:func:`cory_rl.agents.turns.without_empty_rows`)."""
        return turns.without_empty_rows(rollout)

    def has_experience(self) -> bool:  # the Learner capability
        return self.rollout is not None and len(self.rollout.rewards) > 0

    def discard_turn(self) -> None:
        """Let the finished turn(s) go and keep the rollout already collected (a batch the
        loop played for another seat's dynamic sampling)."""
        self.turn = None
        self.closed_turns, self.closed_roles = [], []

    def turn_credit(self, rewards: np.ndarray, roles: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """What each turn of a game of several rounds is credited with, from the rewards
        ``(B, K)`` the game paid (NaN: a turn not paid), and whether it was paid: here the
        turn's own reward, later ones reaching it through the learner's discount. ``roles``:
        the role of each column's turn (a learner in several seats plays several)."""
        return np.nan_to_num(rewards, nan=0.0), ~np.isnan(rewards)

    def _episodes_rollout(self, rewards: np.ndarray) -> Rollout:
        """The turns :meth:`end_turn` kept, one row each (turn after turn, each turn's B
        games), credited as :meth:`turn_credit` says; each seat's turns of a game are one
        episode (a seat's role is fixed within a game)."""
        closed, self.closed_turns = self.closed_turns, []
        roles, self.closed_roles = self.closed_roles, []
        B, K = rewards.shape
        if len(closed) != K:
            raise RuntimeError(
                f"end_rollout() with rewards for {K} turns after {len(closed)} end_turn() calls"
            )
        credit, paid = self.turn_credit(rewards, roles)
        for k, part in enumerate(closed):
            part.rewards = torch.as_tensor(credit[:, k], dtype=torch.float32)
        rollout = concat_rollouts(closed, self.pad_token_id)
        seat = {role: i for i, role in enumerate(dict.fromkeys(roles))}
        rollout.episode = torch.cat([torch.arange(B) + seat[r] * B for r in roles])
        rollout.turn = torch.as_tensor(
            [roles[:k].count(r) for k, r in enumerate(roles)]
        ).repeat_interleave(B)
        rollout.paid = torch.as_tensor(paid.T.reshape(-1))
        return self.empty_turns(rollout)

    def empty_turns(self, rollout: Rollout) -> Rollout:
        """What becomes of turns in which no token was accepted (a refereed game's rows
        that waited): left out, their pay credited to the episode's previous turn
        (:func:`cory_rl.agents.turns.without_empty_turns`)."""
        return turns.without_empty_turns(rollout)

    def _close_turn(
        self, num_generated: np.ndarray, rewards: np.ndarray, turn: Turn | None = None
    ) -> Rollout:
        """The turn (default: the one being played) as a rollout: the tokens the game
        accepted and the rewards it paid."""
        turn = turn or self.turn
        if turn is None or not turn.tokens:
            raise RuntimeError("end_rollout() without a turn: act() was never called this game")
        accepted = torch.as_tensor(np.asarray(num_generated), dtype=torch.long)
        mask = (torch.arange(len(turn.tokens))[None, :] < accepted[:, None]).long()
        tokens = torch.stack(turn.tokens, dim=1)
        return Rollout(
            prompt_ids=turn.prompt_ids,
            prompt_mask=turn.prompt_mask,
            tokens=torch.where(mask.bool(), tokens, self.pad_token_id),
            mask=mask,
            logprobs=torch.stack(turn.logprobs, dim=1) * mask,
            sample_logprobs=torch.stack(turn.sample_logprobs, dim=1) * mask,
            values=torch.stack(turn.values, dim=1) * mask,
            full_logprobs=torch.stack(turn.full_logprobs, dim=1) if turn.full_logprobs else None,
            rewards=torch.as_tensor(np.asarray(rewards), dtype=torch.float32),
            engine_logprobs=engine_logprobs(turn, mask),
        )

    def turn_stats(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Summed KL to the reference, summed log-prob, mean entropy and final value per game
        (in several seats, of the last turn of the seat whose ``obs`` it is)."""
        turn = self.turn
        if self.seats > 1:
            turn = self.last_turns.get(int(np.asarray(obs["role"]).reshape(-1)[0]), turn)
        if turn is None or not turn.tokens:
            return {}
        generated = obs["num_generated"]
        rollout = self._close_turn(generated, np.zeros(len(generated)), turn)
        mask = rollout.mask.float()
        lengths = mask.sum(dim=1)
        last = (lengths.long() - 1).clamp(min=0)[:, None]
        if rollout.full_logprobs is not None:
            entropy = pm.entropy_from_logits(rollout.full_logprobs)
        else:
            entropy = torch.stack(turn.entropies, dim=1)
        exact = "full" if rollout.full_logprobs is not None else None
        return {
            "kl": self.reference_pass(rollout, exact)[0].sum(dim=1).numpy(),
            "logprob": rollout.logprobs.sum(dim=1).numpy(),
            "entropy": ((entropy * mask).sum(dim=1) / lengths.clamp(min=1)).numpy(),
            "value": rollout.values.gather(1, last).squeeze(1).numpy(),
            "length": lengths.numpy(),
        }

    # ------------------------------------------------------------------ learning
    def learn(self) -> dict[str, float]:
        """One update on the rollout collected since the last call (the learner's own)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    def take_rollout(self) -> Rollout:
        """The rollout collected since the last :meth:`learn` (then forgotten), with the
        engine correction's weights of its tokens, if an engine drew them."""
        if self.rollout is None:
            raise RuntimeError("learn() before any end_rollout(): nothing was collected")
        rollout, self.rollout = self.rollout, None
        rollout.is_weights = self.engine_seat.correction_weights(rollout)
        return rollout

    def start_update(self) -> ShapedRollout:
        """What every update starts from: the rollout collected (:meth:`take_rollout`), its
        KL to the reference, its scaled scores and the KL coefficient in force."""
        return self.shaping.shape(self.take_rollout(), self.watch)

    def reference_pass(
        self, rollout: Rollout, measure: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The KL to the reference per token (``measure``: ``full`` or a sampled estimator;
        default the configured penalty's) and the reference's token log-probs
        (:meth:`cory_rl.agents.llm_reference.RewardShaping.reference_pass`)."""
        return self.shaping.reference_pass(rollout, self.watch, measure)

    def reference_kl(self, rollout: Rollout) -> torch.Tensor:
        """KL(pi || pi_ref) per response token (see :meth:`reference_pass`)."""
        return self.reference_pass(rollout)[0]

    def update(
        self,
        data: dict[str, torch.Tensor],
        loss_fn: LossFn,
        *,
        epochs: int,
        unit: Literal["token", "answer"] = "token",
        weigh_micro_batches: Literal["rows", "units"] = "units",
        prefix: str | None = None,
        loss_mask: str = "mask",
    ) -> dict[str, float]:
        """Step ``loss_fn`` over ``data`` (:func:`cory_rl.agents.update.minibatch_update`,
        its statistics under ``prefix``, default the learner's name); the weights changed,
        so their version moves on (a rollout engine reloads them before its next turn)."""
        stats = minibatch_update(
            self.optimisation,
            data,
            loss_fn,
            self.config,
            epochs=epochs,
            prefix=prefix or self.name,
            watch=self.watch,
            unit=unit,
            weigh_micro_batches=weigh_micro_batches,
            loss_mask=loss_mask,
        )
        self.weights_version += 1
        return stats

    def finish(self, shaped: ShapedRollout) -> dict[str, float]:
        """Update the KL controller from the batch's mean summed KL (over every process);
        return the statistics every LLM learner reports (the loop's ``kl`` is
        ``objective/kl``). In a game of several rounds an answer is a turn: the KL is a
        turn's, the rewards those of the turns paid."""
        rollout = shaped.rollout
        seq_kl = shaped.kl.sum(dim=1)
        B = len(rollout.rewards)
        measured = {}
        if self.shaping.needs_reference_pass:  # else no KL was measured: none is reported
            mean_kl = self.optimisation.mean_over_processes(seq_kl)
            self.shaping.kl_ctl.update(mean_kl, B * self.accelerator.num_processes)
            measured = {"objective/kl": float(seq_kl.mean())}
        paid = rollout.rewards if rollout.paid is None else rollout.rewards[rollout.paid]
        return {
            "env/reward_mean": float(paid.mean()),
            "env/reward_std": float(paid.std()) if len(paid) > 1 else 0.0,
            "env/response_length": float(rollout.mask.float().sum(dim=1).mean()),
            **measured,
            "objective/kl_coef": shaped.kl_coef,
            f"{self.name}/scores_scaled_mean": float(shaped.scores.mean()),
            **self.engine_seat.stats(),
        }

    def restart(self) -> None:
        """A fresh optimiser state, KL coefficient and score statistics; the weights, the
        value head and the random streams are kept. What the official CORY code's
        save-and-reload at each role exchange amounts to (``restart_on_exchange``)."""
        self.optimisation.restart()
        self.shaping.restart()

    # ------------------------------------------------------------------ persistence
    def save(self, path: Path, writer: state_io.WriteQueue | None = None) -> None:
        """Weights, optimiser, RNG, KL and score states (``agents/llm_state.py``)."""
        llm_state.save(
            path, self.name, self.config, self.optimisation, self.sampler, self.shaping, writer
        )

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a bad file raises ``CheckpointError`` naming it."""
        self.weights_version += 1  # the weights change (an engine reloads them)
        llm_state.load(path, self.name, self.optimisation, self.sampler, self.shaping)

    def process_rng(self) -> dict[str, torch.Tensor]:
        """This process's random streams (each process of a run draws its own)."""
        return llm_state.process_rng(self.sampler, self.optimisation)

    def load_process_rng(self, states: dict[str, torch.Tensor]) -> None:
        llm_state.load_process_rng(states, self.sampler, self.optimisation)

    def export(
        self, path: Path, tokenizer: Any, merge: bool = False, info: dict | None = None
    ) -> Path:
        """The policy as a Hugging Face model folder plus its value head (agents/export.py)."""
        return export_policy(self.model, tokenizer, path, merge, info)
