"""One seat of the game as a ``gymnasium.Env``, the other seats played by given policies.

Single-agent RL libraries (Stable-Baselines3, CleanRL, ...) take a seat this way::

    env = cory_env.single_seat("arith", seat="llm_1", others={"llm_0": pioneer},
                               tokenizer=cory_env.small_vocab_tokenizer(),
                               **cory_env.SMALL_VOCAB_ARITH)

One game is played per episode (B=1). ``reset()`` starts a game and plays the other seats
until it is this seat's turn; each ``step(token)`` appends one token of this seat's
answer. When its turn ends (EOS or the token budget) the seats after it play, the game is
scored, and the episode terminates with the seat's reward. Rewards are 0 before that.

Observation (a ``spaces.Dict``, the game's observation of the seat):

- ``input_ids``: the seat's left-padded context window (prompt and its answer so far),
  ``MultiDiscrete([vocab] * context_length)`` by default, which SB3 one-hot encodes (fit
  for small vocabularies; see :func:`cory_env.small_vocab_tokenizer`), or with
  ``ids_space="box"`` an integer ``Box(0, vocab - 1)`` (for models that embed ids);
- ``attention_mask``: ``MultiBinary(context_length)``, 1 where ``input_ids`` hold text;
- ``role``: ``Discrete(n_agents)``, 0 = pioneer (roles rotate with
  ``role_exchange_period``);
- ``num_generated``: ``Discrete(context_length + 1)``, tokens of the answer so far.

Action: ``Discrete(vocab)``, one token id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from cory_env import checks
from cory_env.aec import TextGameEnv, check_one_game
from cory_env.core import BatchedTextGame, split_settings
from cory_env.tasks import Task

REWARDS = ("game", "score")
"""Values of ``reward``: the game's pay (``r_self + lam * sum(r_others)``) or the seat's
own task score."""
IDS_SPACES = ("multidiscrete", "box")

Policy = Any
"""``"random"``, an object with ``act(batched_obs) -> (B,) token ids`` (the learner
protocol of ``agents/base.py``), or a callable ``obs -> token id`` on one unbatched
observation (as the AEC env's ``observe`` gives it)."""


class SingleSeatEnv(gymnasium.Env):
    """A ``gymnasium.Env`` view of ``seat`` in a one-game :class:`BatchedTextGame`.

    ``others`` maps every other agent to a policy (see :data:`Policy`); by default they play
    uniformly random tokens. Policies are used, never trained here: an object's ``act`` is
    called, nothing else, except that a policy with a ``seed(int)`` method is reseeded on
    a seeded ``reset`` (seeds drawn from the env's ``np_random``), so that a seed fixes the
    whole game.

    A seeded ``reset(seed=...)`` also starts the game's episode count over at 0 (the
    episode number sets the roles), so that a seed fixes the roles too;
    ``options={"episode": n}`` plays episode ``n``. An unseeded reset plays the next
    episode, rotating roles every ``role_exchange_period`` episodes.

    ``reward="game"`` (default) pays what the game pays the seat; ``"score"`` its own task
    score (for the arith task, the answer check: 1 or 0). ``info`` holds the role, the
    game's episode number (``game_episode``: ``episode`` is where gymnasium's and SB3's
    monitors put their episode statistics), the query, the answers and every seat's raw
    scores once the game is over.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        game: BatchedTextGame,
        seat: str = "llm_1",
        others: Mapping[str, Policy] | None = None,
        *,
        reward: str = "game",
        ids_space: str = "multidiscrete",
        render_mode: str | None = None,
    ) -> None:
        where = "single_seat"
        if not isinstance(game, BatchedTextGame):
            raise TypeError(f"{where}: game must be a BatchedTextGame, got {type(game).__name__}")
        if game.batch_size != 1:
            raise ValueError(
                f"{where}: the single-seat view plays one game at a time; the game has "
                f"batch_size={game.batch_size} (build it with batch_size=1)"
            )
        check_one_game(game.settings)
        if seat not in game.possible_agents:
            raise ValueError(
                f"{where}: seat must be one of the game's agents {game.possible_agents}, "
                f"got {seat!r}"
            )
        self.reward_kind = checks.choice(reward, "reward", REWARDS, where=where)
        ids_space = checks.choice(ids_space, "ids_space", IDS_SPACES, where=where)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"{where}: render_mode must be one of {self.metadata['render_modes']} or "
                f"None, got {render_mode!r}"
            )
        self.game = game
        self.seat = seat
        self.render_mode = render_mode
        self.others = self._check_others(others)
        L = game.context_length
        vocab = game.action_space(seat).n
        ids = (
            spaces.MultiDiscrete(np.full(L, vocab, dtype=np.int64))
            if ids_space == "multidiscrete"
            else spaces.Box(0, vocab - 1, (L,), np.int64)
        )
        self.observation_space = spaces.Dict(
            {
                "input_ids": ids,
                "attention_mask": spaces.MultiBinary(L),
                "role": spaces.Discrete(game.n_agents),
                "num_generated": spaces.Discrete(L + 1),
            }
        )
        self.action_space = spaces.Discrete(vocab)
        self._playing = False

    def _check_others(self, others: Mapping[str, Policy] | None) -> dict[str, Policy]:
        agents = [a for a in self.game.possible_agents if a != self.seat]
        if others is None:
            return dict.fromkeys(agents, "random")
        if not isinstance(others, Mapping):
            raise TypeError(
                f"single_seat: others must map each other agent {agents} to a policy, got "
                f"{type(others).__name__}"
            )
        missing = [a for a in agents if a not in others]
        unknown = [a for a in others if a not in agents]
        if missing or unknown:
            raise ValueError(
                f"single_seat: others must have one entry per other agent {agents} (the seat "
                f"{self.seat!r} is played through step()); missing {missing}, unknown {unknown}"
            )
        for agent, policy in others.items():
            random = isinstance(policy, str) and policy == "random"
            if not (random or hasattr(policy, "act") or callable(policy)):
                raise TypeError(
                    f"single_seat: the policy for {agent} must be 'random', an object with "
                    f"act(batched_obs), or a callable obs -> token id; got {policy!r}"
                )
        return {a: others[a] for a in agents}

    # ----------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            for agent in self.others:
                policy = self.others[agent]
                reseed: Callable[[int], Any] | None = getattr(policy, "seed", None)
                if callable(reseed) and not isinstance(policy, str):
                    reseed(int(self.np_random.integers(2**31)))
            options = {"episode": 0, **(options or {})}
        game_seed = None if seed is None else int(self.np_random.integers(2**31))
        self.game.reset(seed=game_seed, options=options)
        self._playing = True
        self._play_others()
        return self._observe(), self._info()

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if not self._playing:
            raise RuntimeError(
                "single_seat: the episode is over (or never started); call reset() first"
            )
        if np.ndim(action) != 0:
            raise ValueError(
                f"single_seat: the action for {self.seat} must be one token id (a scalar), "
                f"got shape {np.shape(action)}"
            )
        self.game.step(np.asarray([action]), agent=self.seat)
        reward = 0.0
        if self.game.agent_selection != self.seat or self.game.done:
            self._play_others()
            self._playing = False
            if self.reward_kind == "game":
                reward = float(self.game.rewards[self.seat][0])
            else:
                reward = float(self.game.scores[self.seat][0])
        return self._observe(), reward, not self._playing, False, self._info()

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        info = self._info()
        lines = [f"query: {info['query']!r}"]
        for agent, text in info["responses"].items():
            score = info["scores"].get(agent)
            tail = "" if score is None else f"  (score {score:+.3f})"
            lines.append(f"{agent} [{info['roles'][agent]}]: {text!r}{tail}")
        return "\n".join(lines)

    # ----------------------------------------------------------------- helpers
    def _play_others(self) -> None:
        """Let the other seats play until it is this seat's turn or the game is over."""
        game = self.game
        while not game.done and game.agent_selection != self.seat:
            agent = game.agent_selection
            game.step(np.asarray([self._other_action(agent)]), agent=agent)

    def _other_action(self, agent: str) -> int:
        policy = self.others[agent]
        if isinstance(policy, str):  # "random"
            return int(self.np_random.integers(self.game.action_space(agent).n))
        batched = self.game.observe(agent)
        if hasattr(policy, "act"):
            actions = np.asarray(policy.act(batched))
            if actions.shape != (1,):
                raise ValueError(
                    f"single_seat: the policy for {agent} returned shape {actions.shape} from "
                    "act() for a batch of one game; expected (1,)"
                )
            return int(actions[0])
        obs = {
            "input_ids": batched["input_ids"][0],
            "attention_mask": batched["attention_mask"][0],
            "role": int(batched["role"][0]),
            "num_generated": int(batched["num_generated"][0]),
        }
        action = policy(obs)
        if np.ndim(action) != 0:
            raise ValueError(
                f"single_seat: the policy for {agent} must return one token id, got shape "
                f"{np.shape(action)}"
            )
        return int(action)

    def _observe(self) -> dict[str, Any]:
        obs = self.game.observe(self.seat)
        return {
            "input_ids": obs["input_ids"][0],
            "attention_mask": obs["attention_mask"][0].astype(np.int8),
            "role": int(obs["role"][0]),
            "num_generated": int(obs["num_generated"][0]),
        }

    def _info(self) -> dict[str, Any]:
        info = self.game.info(self.seat)
        return {
            "role": info["role"],
            "roles": info["roles"],
            "game_episode": info["episode"],  # not "episode": wrappers put statistics there
            "query": info["queries"][0],
            "responses": {a: texts[0] for a, texts in info["responses"].items()},
            "scores": {a: float(s[0]) for a, s in info["scores"].items()},
        }


def single_seat(
    task: str | Task | BatchedTextGame | TextGameEnv = "arith",
    seat: str = "llm_1",
    others: Mapping[str, Policy] | None = None,
    *,
    reward: str = "game",
    ids_space: str = "multidiscrete",
    render_mode: str | None = None,
    **settings: Any,
) -> SingleSeatEnv:
    """A ``gymnasium.Env`` of ``seat``, the other seats played by ``others``.

    ``task`` is a task name or :class:`Task` (the game is built with ``batch_size=1`` and
    ``settings``), a one-game :class:`BatchedTextGame`, or a :class:`TextGameEnv` (its game
    is taken over: use one view of a game at a time). See :class:`SingleSeatEnv`.
    """
    if isinstance(task, TextGameEnv):
        game = task.game
    elif isinstance(task, BatchedTextGame):
        game = task
    else:
        game_settings, _ = split_settings(settings)
        game_settings.validate()
        check_one_game(game_settings)
        game = BatchedTextGame(task, batch_size=1, **settings)
        settings = {}
    if settings:
        raise ValueError(
            f"single_seat: settings {sorted(settings)} were given with a ready game; set them "
            "when building the game"
        )
    return SingleSeatEnv(
        game, seat, others, reward=reward, ids_space=ids_space, render_mode=render_mode
    )
