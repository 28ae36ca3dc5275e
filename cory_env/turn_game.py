"""The game one whole answer at a time: the turn-level face of the same rules.

LLM trainers (TRL, OpenEnv clients, verl's agent loops) see a prompt and give a whole answer;
they do not step tokens. This face plays such an answer through the very rules object the
token-level game is (:class:`BatchedTextGame`): the answer is tokenized by the seat's
tokenizer and its tokens, then EOS, are stepped as if sampled one by one. So the token
budget cuts it, and roles, role exchange, ``lam``, rounds, scores and per-turn rewards are
the token-level game's, not a second implementation. The seat's observation is the prompt
text it would read (the task's template over the query and the answers ``sees`` allows).

An answer is kept as its tokens decode (``skip_special_tokens``), as in the token-level
game, which for most tokenizers is the answer itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from cory_env.aec import TextGameEnv, check_one_game
from cory_env.core import BatchedTextGame, split_settings

MAX_PROMPT_CHARS = 1 << 20
"""The longest prompt text the observation space holds."""
MAX_ANSWER_CHARS = 1 << 16
"""The longest answer text the action space holds (the token budget cuts it sooner)."""


class AnyText(spaces.Text):
    """A ``Text`` space of any characters: prompts and answers are free text (IMDB reviews
    hold any Unicode). ``sample()`` draws printable ASCII, of at most ``sample_length``."""

    def __init__(self, max_length: int, sample_length: int = 64, seed: int | None = None):
        printable = "".join(chr(c) for c in range(32, 127))
        super().__init__(max_length, min_length=0, charset=printable, seed=seed)
        self.sample_length = min(sample_length, max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            length = int(self.np_random.integers(0, self.sample_length + 1))
            return "".join(self.np_random.choice(self.character_list, size=length))
        return super().sample(mask, probability)

    def __repr__(self) -> str:
        return f"AnyText({self.max_length})"


def play_answers(game: BatchedTextGame, answers: Sequence[str], agent: str | None = None) -> None:
    """End the acting agent's turn with ``answers`` (one text per row of ``game``).

    Each answer is tokenized by the agent's tokenizer (no special tokens added) and its
    tokens, then EOS, are stepped through ``game.step``: the turn ends at the first EOS or at
    the token budget, exactly as if the tokens had been sampled. ``agent`` asserts whose
    turn it is. Rows whose turn is already over (a refereed match that waits) ignore theirs.
    """
    if game.done:
        raise RuntimeError("the game is over: every agent has answered; call reset()")
    acting = game.agent_selection
    if agent is not None and agent != acting:
        raise ValueError(f"an answer from {agent!r}, but it is the turn of {acting!r}")
    if isinstance(answers, str) or len(answers) != game.batch_size:
        raise ValueError(
            f"answers for {acting} must be a list of {game.batch_size} texts (one per game), "
            f"got {answers!r:.200}"
        )
    bad = [type(a).__name__ for a in answers if not isinstance(a, str)]
    if bad:
        raise TypeError(f"answers for {acting} must be texts (str), got {bad[0]}")
    tokenizer = game.tokenizers[game.possible_agents.index(acting)]
    ids = tokenizer(list(answers), add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    turns, t = len(game.turns), 0
    while len(game.turns) == turns:  # the budget ends every turn
        game.step(np.array([row[t] if t < len(row) else eos for row in ids]), agent=acting)
        t += 1


class TurnGameEnv(TextGameEnv):
    """The game as a PettingZoo AEC env whose step is one whole answer (a ``str``).

    Observation: ``{"prompt": str, "role": int}``: the prompt text of the agent's current
    turn (the latest it answered once it waits; ``""`` before its first turn) and its role
    (0 = pioneer). Action: the answer as text (:class:`AnyText`). Rewards, terminations,
    infos, ``state()`` and ``state_text()`` are the token-level env's, from the same game.
    """

    metadata = {**TextGameEnv.metadata, "name": "cory_turn_game_v0"}

    def __init__(self, game: BatchedTextGame, render_mode: str | None = None) -> None:
        super().__init__(game, render_mode=render_mode)
        self._text_obs = {
            a: spaces.Dict(
                {
                    "prompt": AnyText(MAX_PROMPT_CHARS),
                    "role": spaces.Discrete(game.n_agents),
                }
            )
            for a in self.possible_agents
        }
        self._text_actions = {a: AnyText(MAX_ANSWER_CHARS) for a in self.possible_agents}
        self._prompts: dict[str, str] = {}

    def observation_space(self, agent: str) -> spaces.Dict:
        self.game.observation_space(agent)  # the game's clear error for an unknown agent
        return self._text_obs[agent]

    def action_space(self, agent: str) -> AnyText:
        self.game.action_space(agent)
        return self._text_actions[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        super().reset(seed=seed, options=options)
        self._prompts = {a: "" for a in self.possible_agents}
        self._prompts[self.game.agent_selection] = self.game.prompt_texts[0]

    def observe(self, agent: str) -> dict[str, Any]:
        self._require("observe()")
        self.game.observation_space(agent)
        return {"prompt": self._prompts[agent], "role": self.game.observe(agent)["role"][0].item()}

    def step(self, action: Any) -> None:
        self._require("step()", live=True)
        agent = self.agent_selection
        if self._finished_step(agent, action):
            return
        if not isinstance(action, str):
            raise TypeError(
                f"{agent} is acting and needs its answer as text (str), got {type(action).__name__}"
            )
        paid = len(self.game.turn_rewards[agent])
        play_answers(self.game, [action], agent=agent)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        if len(self.game.turn_rewards[agent]) > paid:  # a round ended: each agent's pay
            for a in self.agents:
                self.rewards[a] = float(self.game.turn_rewards[a][-1][0])
        if self.game.done:
            for a in self.agents:
                self.terminations[a] = True
        else:
            self._prompts[self.game.agent_selection] = self.game.prompt_texts[0]
        self.infos = {a: self._info(a) for a in self.agents}  # every step ends a turn
        self._turns_seen = len(self.game.turns)
        self.agent_selection = self.game.agent_selection
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()


def turn_game(task: Any = "imdb", render_mode: str | None = None, **settings: Any) -> TurnGameEnv:
    """The CORY game as a PettingZoo ``AECEnv`` stepped one whole answer at a time.

    ``settings`` are those of :func:`cory_env.text_game` (the token-level env of the same
    game); ``tokenizer`` (default: the embedded model's) cuts answers to the token budget.
    """
    game_settings, _ = split_settings(settings)
    game_settings.validate()
    check_one_game(game_settings)  # the same checks as the token-level env's
    return TurnGameEnv(BatchedTextGame(task, batch_size=1, **settings), render_mode=render_mode)
