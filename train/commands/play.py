"""Talk to trained agents: each answers a query in turn, as the game seats them.

python train/play.py runs/cory-imdb-...                    # interactive: type queries
python train/play.py runs/cory-imdb-... --query "The movie"  # one query, then exit
python train/play.py --model exported/llm_0 --model embedded --query "The movie"

A run's agents come from its checkpoint; ``--model`` seats Hugging Face folders (an
exported agent, ``embedded``, a hub id) in order instead. For each query every agent
answers in its role (the pioneer first; ``--pioneer`` picks which agent), and the task
scores each answer and pays the rewards of the run's game (``lam``).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from cory_env.query import Query
from cory_rl.train.commands.parser import (
    ArgumentParser,
    non_empty_text,
    number_at_least,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.core.games import batch_samples, make_game, play_games
from cory_rl.train.core.run_folder import load_run_config
from cory_rl.train.core.trained import load_trained

WIDTH = 88


def load_players(
    run_dir: Path | None, models: list[str], task: str | None
) -> tuple[Any, list[Any], dict[str, Any]]:
    """The config, the seats' tokenizers and the learners of a run (from its checkpoint),
    or of the given models."""
    if run_dir is not None:
        trained = load_trained(run_dir, {"device": "cpu", **({"task": task} if task else {})})
        return trained.config, trained.game.tokenizers, trained.learners
    algorithm = "ppo" if len(models) == 1 else "cory"
    overrides = {
        "device": "cpu",
        "task": task or "imdb",
        "model": models[0],
        "n_agents": len(models),
        "models": {f"llm_{i}": m for i, m in enumerate(models)},
    }
    config = build_config(overrides=overrides, algorithm=algorithm)
    game, learners = build_game_and_learners(config)
    return config, game.tokenizers, learners


class Table:
    """One game for each typed query, with the players' seats and the run's game rules."""

    def __init__(
        self, config: Any, tokenizers: list[Any], learners: dict[str, Any], pioneer: str | None
    ) -> None:
        self.config, self.learners = config, learners
        self.game = make_game(config, tokenizers, group_size=1, batch_size=1)
        agents = config.agents
        if pioneer is not None and pioneer not in agents:
            raise ValueError(f"--pioneer {pioneer}: the seats are {agents}")
        # Episode e seats the pioneer role on agent (e // period) % n: pick the episode.
        self.episode = agents.index(pioneer or agents[0]) * config.game.role_exchange_period

    def play(self, text: str, budget: int | None = None) -> dict[str, Any]:
        """Every agent's answer to ``text`` in its role, with scores and rewards."""
        game = self.game
        text = text.strip()
        if not text:
            raise ValueError("an empty query: type a few words for the pioneer to continue")
        game.task.queries.append(Query(text))
        try:
            game.reset(
                options={
                    "episode": self.episode,
                    "queries": [len(game.task.queries) - 1],
                    "budgets": [budget or game.budget_high],
                }
            )
            play_games(game, self.learners)
        finally:
            game.task.queries.pop()
        [sample] = batch_samples(game, 1)
        return sample


def show(sample: dict[str, Any]) -> str:
    """A game as a reader wants it: the query, then each role's answer, score and reward."""
    lines = [f"query: {sample['query']!r}"]
    for role, turn in sample.items():
        if role == "query":
            continue
        head = f"  {role} ({turn['agent']}): "
        answer = textwrap.fill(
            repr(turn["response"]), WIDTH, initial_indent=head, subsequent_indent=" " * len(head)
        )
        lines += [
            answer,
            f"{' ' * len(head)}score {turn['score']:+.3f}, reward {turn['reward']:+.3f}",
        ]
    return "\n".join(lines)


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("run_dir", type=Path, nargs="?", help="a run folder with a checkpoint")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="FOLDER",
        help="seat this model (an exported agent, 'embedded', a hub id); "
        "repeat for each seat, instead of a run",
    )
    parser.add_argument(
        "--query",
        action="append",
        default=[],
        type=non_empty_text,
        help="a query to play (repeatable); none: type them",
    )
    parser.add_argument("--pioneer", help="the agent that answers first (default llm_0)")
    parser.add_argument("--task", help="the task that scores the answers (default the run's)")
    parser.add_argument(
        "--max_new_tokens",
        type=number_at_least(1, integer=True),
        help="tokens per answer (default: the most the game allows)",
    )
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (not args.model):
        parser.error("give a run folder or --model folders (one per seat), not both or neither")
    if args.run_dir is not None and not (args.run_dir / "config.yaml").is_file():
        parser.error(f"{args.run_dir} is not a run folder (it has no config.yaml)")
    try:
        if args.pioneer is not None:  # before any model loads
            seats = (
                load_run_config(args.run_dir).agents
                if args.run_dir is not None
                else [f"llm_{i}" for i in range(len(args.model))]
            )
            if args.pioneer not in seats:
                raise ValueError(f"--pioneer {args.pioneer}: the seats are {seats}")
        table = Table(*load_players(args.run_dir, args.model, args.task), args.pioneer)
    except (*USER_ERRORS, ValueError) as err:
        parser.error(one_line(err).removeprefix("error: "))
    played = []
    queries = args.query or _typed_queries()
    for query in queries:
        try:
            sample = table.play(query, args.max_new_tokens)
        except ValueError as err:
            print(f"  {err}")
            continue
        played.append(sample)
        print(show(sample), flush=True)
    return played


def _typed_queries():
    """Queries typed at a prompt, until an empty line or end of input."""
    print("type a query and press enter (an empty line or Ctrl-D ends)", file=sys.stderr)
    while True:
        try:
            line = input("query> ")
        except EOFError:
            return
        if not line.strip():
            return
        yield line


if __name__ == "__main__":
    main()
