"""How often a policy writes a valid TextArena move, and how often it wins, against a fixed
opponent (the base model) on held-out matches.

The policy is a run's agent (``RUN:llm_0``; a self-play run's shared learner is its
``llm_0``) or, without ``--run``, the base model itself. It plays half the matches as
player 0 and half as player 1 (roles exchange every match); both seats sample at
temperature 1 from their own streams, seeded. Matches are seeded from 1,000,000 on, apart
from training's.

    python examples/textarena_vs_base.py --run RUN          # the trained policy vs the base
    python examples/textarena_vs_base.py --run RUN --base   # the base vs itself, same game
    python examples/textarena_vs_base.py                    # the base vs itself, defaults

``--base`` keeps the run's game and sampling settings (budget, repetition penalty,
rounds) and seats the base model in the policy's seat: the "before" of a before/after.

needs ``pip install -e ".[textarena]"``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.checkpoint import find_checkpoint
from cory_rl.train.core.games import play_games
from cory_rl.train.core.run_folder import load_run_config
from cory_rl.train.evaluation.cross_play import BASE, Player, seated_config


def template(run: Path | None, env_id: str, rounds: int, matches: int) -> Any:
    """The game to measure in: the run's (its task settings, budget, rounds) or a default."""
    if run is not None:
        config = load_run_config(run, {"device": "cpu"})
        settings = {**config.task_settings, "first_seed": 1_000_000, "n_queries": matches}
        return build_config(
            overrides={
                **{k: v for k, v in config.to_dict().items() if k not in ("learners", "run_dir")},
                "task_settings": settings,
            }
        )
    game = {"lam": 0.0, "rounds": rounds}
    return build_config(
        overrides={
            "task": "textarena",
            "task_settings": {"env_id": env_id, "first_seed": 1_000_000, "n_queries": matches},
            "device": "cpu",
            "game": game,
        }
    )


def measure(
    run: Path | None,
    base: bool = False,
    env_id: str = "TicTacToe-v0-train",
    rounds: int = 5,
    matches: int = 64,
    batch_size: int = 16,
    seed: int = 0,
) -> dict[str, float]:
    """Play ``matches`` matches, the policy (``base``: the base model) in seat ``llm_0``, the
    base model in ``llm_1``."""
    trained = run is not None and not base
    policy = Player(f"{run}:llm_0", run, "llm_0") if trained else Player(BASE)
    config = seated_config(
        {"llm_0": policy, "llm_1": Player(BASE)}, template(run, env_id, rounds, matches)
    )
    config.seed, config.batch_size = seed, batch_size
    config.game = type(config.game)(**{**config.game.__dict__, "role_exchange_period": 1})
    game, learners = build_game_and_learners(config)
    if trained:
        learners["llm_0"].load(find_checkpoint(run) / "llm_0")
    totals = {"moves": 0, "invalid": 0, "wins": 0, "draws": 0, "losses": 0, "unfinished": 0}
    game.reset(seed=seed)
    for _ in range(max(matches // batch_size, 2)):
        play_games(game, learners)
        player = int(game.observe("llm_0")["role"][0])  # the policy's seat: this player
        for match in game.matches:
            totals["moves"] += match.moves[player]
            totals["invalid"] += match.invalid[player]
            result = match.result()
            if result is None:
                totals["unfinished"] += 1
            else:
                mine, theirs = result[player], result[1 - player]
                key = "wins" if mine > theirs else "losses" if mine < theirs else "draws"
                totals[key] += 1
        game.reset()
    played = totals["wins"] + totals["draws"] + totals["losses"] + totals["unfinished"]
    return {
        "matches": played,
        "valid_move_rate": 1 - totals["invalid"] / max(totals["moves"], 1),
        "win_rate": totals["wins"] / played,
        "draw_rate": totals["draws"] / played,
        "loss_rate": totals["losses"] / played,
        "unfinished_rate": totals["unfinished"] / played,
        "moves": totals["moves"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--run", type=Path, help="a run folder whose llm_0 plays (default: the base model)"
    )
    parser.add_argument(
        "--base", action="store_true", help="seat the base model as the policy, in --run's game"
    )
    parser.add_argument(
        "--env_id", default="TicTacToe-v0-train", help="the TextArena game without --run"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="moves per player at most, without --run"
    )
    parser.add_argument("--matches", type=int, default=64, help="matches to play")
    parser.add_argument("--batch_size", type=int, default=16, help="matches played at once")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    args = parser.parse_args()
    figures = measure(
        args.run, args.base, args.env_id, args.rounds, args.matches, args.batch_size, args.seed
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
