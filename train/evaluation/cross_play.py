"""Any agent in any seat: agents of different runs (or the base model, or a Hugging Face
folder) play the game together on the fixed held-out set.

python train/evaluate.py --seats "{llm_0: runs/a:llm_1, llm_1: runs/b:llm_0}"
python train/evaluate.py --cross_play runs/cory-0 runs/cory-1:llm_0 runs/ppo-0 --out xplay/

A player is ``RUN:AGENT`` (that agent of that run, from its checkpoint, with its own
learner and sampling settings), ``base`` (the untrained base model of the first run) or a
model folder or hub id (an exported agent). The game, the task and the evaluation set are
those of the first run. ``--cross_play`` seats every player as pioneer against every
player as observer (the base model included) and writes the observer's reward and the
pair's (pioneer + observer task score) per cell, with bootstrap intervals over queries, as
``cross_play.csv`` and ``cross_play.png``. Each pair is played in both orders on the same
answers' random numbers, so a cell differs from another by its players only.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from cory_env.checks import SettingError
from cory_env.models import model_problem, resolve
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.checkpoint import find_checkpoint
from cory_rl.train.core.memory import rss_peak_mb
from cory_rl.train.core.run_folder import load_run_config
from cory_rl.train.evaluation import inference, report
from cory_rl.train.evaluation.evaluator import Evaluator, progress_bar

BASE = "base"


@dataclasses.dataclass(frozen=True)
class Player:
    """An agent to seat: a run's agent, the base model, or a model folder / hub id."""

    label: str
    run: Path | None = None
    agent: str | None = None
    model: str | None = None

    @classmethod
    def parse(cls, text: str) -> Player:
        text = str(text).strip()
        if text == BASE:
            return cls(BASE)
        run, sep, agent = text.rpartition(":")
        if sep and agent.startswith("llm_") and (Path(run) / "config.yaml").is_file():
            return cls(text, Path(run), agent)
        if (Path(text) / "config.yaml").is_file() and not (Path(text) / "config.json").exists():
            raise SettingError(f"{text} is a run folder: name its agent, e.g. {text}:llm_0")
        return cls(text, model=text)


def run_players(items: list[str | Path]) -> list[Player]:
    """The players of ``--cross_play``: every agent of each run folder, each ``RUN:AGENT``
    or model named, then the base model (once)."""
    players = []
    for item in items:
        if (Path(item) / "config.yaml").is_file():
            config = load_run_config(Path(item))
            shared = config.shared_seats()  # a learner in several seats is one agent
            agents = [a for a in config.agents if a not in shared]
            players += [Player(f"{item}:{agent}", Path(item), agent) for agent in agents]
        elif str(item) != BASE:
            players.append(Player.parse(str(item)))
    return [*players, Player(BASE)]


def seated_config(players: dict[str, Player], template: Any) -> Any:
    """The config of a game whose seats hold ``players``: the template's game, task and
    evaluation settings; each seat its player's model, learner and learner settings."""
    models, learners, references = {}, {}, {}
    # A base model or a folder samples as the template's first seat does.
    first_name, first_settings = next(iter(template.seat_learners().values()))
    first = {
        "learner": first_name,
        **(dataclasses.asdict(first_settings) if first_settings else {}),
    }
    for seat, player in players.items():
        if player.run is not None:
            run_config = load_run_config(player.run, {"device": "cpu"})
            if run_config.lora:
                raise SettingError(
                    f"{player.label}: cross-play of LoRA runs is not supported yet; export the "
                    "agent with --merge and seat the folder"
                )
            if player.agent not in run_config.agents:
                raise SettingError(f"{player.label}: the run's agents are {run_config.agents}")
            name, settings = run_config.seat_learners()[player.agent]
            models[seat] = run_config.seat_models()[player.agent]
            own = dataclasses.asdict(settings) if settings is not None else {}
            learners[seat] = {"learner": name, **own}
        else:
            models[seat] = template.model if player.model is None else player.model
            learners[seat] = dict(first)
            base = folder_base(models[seat], template.model)
            if base is not None:
                references[seat] = base  # a trained folder: its KL to its base, not to itself
    n = len(players)
    kept = {
        k: v
        for k, v in template.to_dict().items()
        if k not in ("learner", "learners", "models", "references", "run_dir")
    }
    values = {
        **kept,
        "algorithm": "cory" if n > 1 else "ppo",
        "game": {**dataclasses.asdict(template.game), "n_agents": n},
        "device": "cpu" if template.device == "auto" else template.device,
        "model": models[next(iter(players))],
        "models": models,
        "learners": learners,
        "references": references or None,
        "report_to": ["none"],
    }
    return build_config(overrides=values, algorithm=values["algorithm"])


def folder_base(model: str, base: str) -> str | None:
    """The model a seated folder's KL is measured against: the base its export names
    (``cory_export.json``), else ``base`` when the two share a vocabulary (a plain folder
    trained elsewhere from it), else None (the folder itself)."""
    export = Path(model) / "cory_export.json"
    if export.is_file():
        try:
            named = json.loads(export.read_text()).get("model")
        except (OSError, ValueError):
            named = None
        if isinstance(named, str) and named != model and model_problem(named) is None:
            return named
    return base if shares_vocabulary(model, base) else None


def shares_vocabulary(model: str, base: str) -> bool:
    """Whether ``model`` (a folder or hub id) has ``base``'s vocabulary, read from their
    configs: a seated folder is then measured against ``base``, the model it was most likely
    trained from (a KL to itself would be 0). A model of another family keeps itself."""
    from transformers import AutoConfig

    if model == base:
        return False
    try:
        own, theirs = (AutoConfig.from_pretrained(resolve(m)) for m in (model, base))
    except (OSError, ValueError):
        return False
    return own.model_type == theirs.model_type and own.vocab_size == theirs.vocab_size


def template_config(players: list[Player], task: str | None = None) -> Any:
    """The first run's config (its game, task and evaluation settings), or a default one."""
    for player in players:
        if player.run is not None:
            return load_run_config(player.run, {"device": "cpu"})
    return build_config(overrides={"task": task or "imdb", "device": "cpu"})


def play_seats(
    players: dict[str, Player],
    template: Any,
    options: dict[str, Any] | None = None,
    model: str = report.TRAINED,
) -> tuple[Any, dict[str, list[Any]], Any]:
    """Seat ``players`` and play the evaluation set: every seat in every role. Returns the
    config, the answers (labelled ``model``) and the evaluator."""
    options = options or {}
    config = seated_config(players, template)
    for player in players.values():
        if player.run is not None:
            find_checkpoint(player.run)  # before any model loads
    game, learners = build_game_and_learners(config)
    for seat, player in players.items():
        if player.run is not None:
            shared = load_run_config(player.run, {"device": "cpu"}).shared_seats()
            agent = shared.get(player.agent, player.agent)  # the seat's learner's folder
            learners[seat].load(find_checkpoint(player.run) / agent)
    evaluator = Evaluator(
        config,
        game.tokenizers,
        samples=options.get("samples") or config.eval_samples,
        batch_size=options.get("batch_size") or config.eval_batch_size,
        seed=options.get("seed") or config.eval_seed,
        max_queries=options.get("max_queries") or config.eval_queries,
    )
    print(evaluator.size_line(), file=sys.stderr, flush=True)
    desc = " vs ".join(player.label for player in players.values())
    with progress_bar(evaluator.n_batches, desc=desc) as bar:
        answers, _, _, _ = evaluator.play(learners, model, 0, bar)
    return config, answers, evaluator


def pair_numbers(answers: dict[str, list[Any]], pioneer: str, observer: str) -> dict[str, Any]:
    """The observer's and the pair's reward where ``pioneer`` answered first and
    ``observer`` second (means, bootstrap intervals over queries)."""
    first = report.rows_where(answers, agent=pioneer, role="pioneer")
    second = report.rows_where(answers, agent=observer, role="observer")
    key = lambda i: (answers["query"][i], answers["sample"][i])  # noqa: E731
    by_game = {key(i): answers["reward"][i] for i in first}
    queries, observer_rewards, pair_rewards = [], [], []
    for i in second:
        if key(i) in by_game:
            queries.append(answers["query"][i])
            observer_rewards.append(answers["reward"][i])
            pair_rewards.append(by_game[key(i)] + answers["reward"][i])
    queries = np.asarray(queries)
    out: dict[str, Any] = {"games": len(queries)}
    for name, values in (("observer", observer_rewards), ("pair", pair_rewards)):
        values = np.asarray(values, dtype=float)
        _, per_query = inference.per_unit_means(queries, values)
        out[f"{name}_reward"] = float(values.mean())
        out[f"{name}_ci95"] = inference.bootstrap_ci(per_query)
    return out


def cross_play(
    players: list[Player], options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every player as pioneer against every player as observer; one row per cell.

    Each pair plays in a process of its own (spawned, one after another), so memory stays
    that of one pair however many pairs there are: in one process, models released after
    each pair still left memory resident (docs/evaluation.md has the figures)."""
    template = template_config(players)
    cells: list[dict[str, Any]] = []
    spawn = multiprocessing.get_context("spawn")
    for a, b in itertools.combinations_with_replacement(range(len(players)), 2):
        seats = {"llm_0": players[a], "llm_1": players[b]}
        print(f"cross-play: {players[a].label} with {players[b].label}", flush=True)
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:  # a fresh one a pair
            pair, peak_mb, pid = pool.submit(pair_cells, seats, template, options).result()
        print(f"cross-play: that pair peaked at {peak_mb:.0f} MB (process {pid})", flush=True)
        cells += [{**cell, "peak_mb": peak_mb} for cell in pair]
    order = {p.label: i for i, p in enumerate(players)}
    unique = {(c["pioneer"], c["observer"]): c for c in cells}  # a player with itself: once
    return sorted(unique.values(), key=lambda c: (order[c["pioneer"]], order[c["observer"]]))


def pair_cells(
    seats: dict[str, Player], template: Any, options: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], float, int]:
    """One pair's cells (each seat as pioneer), its process's peak memory and its pid."""
    _, answers, _ = play_seats(seats, template, options)
    cells = []
    for pioneer, observer in {("llm_0", "llm_1"), ("llm_1", "llm_0")}:
        numbers = pair_numbers(answers, pioneer, observer)
        cells.append(
            {"pioneer": seats[pioneer].label, "observer": seats[observer].label, **numbers}
        )
    return cells, rss_peak_mb(), os.getpid()


def write_matrix(cells: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """``cross_play.csv`` (one row per cell) and ``cross_play.png`` (two heatmaps)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / "cross_play.csv", out / "cross_play.png"
    columns = [
        "pioneer",
        "observer",
        "games",
        "observer_reward",
        "observer_low",
        "observer_high",
        "pair_reward",
        "pair_low",
        "pair_high",
    ]
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for c in cells:
            numbers = [c["observer_reward"], *c["observer_ci95"], c["pair_reward"], *c["pair_ci95"]]
            writer.writerow(
                [c["pioneer"], c["observer"], c["games"], *(f"{x:.4f}" for x in numbers)]
            )
    labels = list(dict.fromkeys(c["pioneer"] for c in cells))
    index = {label: i for i, label in enumerate(labels)}
    fig = Figure(figsize=(6 + 1.6 * len(labels), 1.2 + 0.8 * len(labels)))
    axes = fig.subplots(1, 2)
    for ax, name in zip(axes, ("observer", "pair"), strict=True):
        grid = np.full((len(labels), len(labels)), np.nan)
        for c in cells:
            grid[index[c["pioneer"]], index[c["observer"]]] = c[f"{name}_reward"]
        image = ax.imshow(grid, cmap="viridis")
        for (i, j), value in np.ndenumerate(grid):
            cell = next(c for c in cells if (c["pioneer"], c["observer"]) == (labels[i], labels[j]))
            low, high = cell[f"{name}_ci95"]
            ax.text(
                j,
                i,
                f"{value:.2f}\n[{low:.2f}, {high:.2f}]",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("observer")
        ax.set_ylabel("pioneer")
        ax.set_title(f"{name} reward (95% CI over queries)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return csv_path, png_path
