"""Export a run's agents as Hugging Face model folders that load without this project.

python train/export.py RUN_DIR OUT_DIR            # OUT_DIR/llm_0, OUT_DIR/llm_1, ...
python train/export.py RUN_DIR OUT_DIR --merge    # LoRA runs: merged weights, not adapters
python train/export.py RUN_DIR OUT_DIR --push_to_hub you/cory-imdb [--private]

Each folder loads with ``AutoModelForCausalLM.from_pretrained(OUT_DIR / "llm_0")`` and
holds the agent's tokenizer, its value head (``value_head.safetensors``) and a model card
(``README.md``: what the agent is, how it was trained and evaluated, how to load it).
``--push_to_hub`` then uploads each folder (``cory_rl.train.publish.hub``), checked before any model
loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cory_rl.train.core.checkpoint import load_json_state
from cory_rl.train.core.games import owners, seats_of
from cory_rl.train.core.run_folder import base_evaluation, final_evaluation, load_run_config
from cory_rl.train.core.trained import build_trained
from cory_rl.train.publish import hub
from cory_rl.train.publish.model_card import model_card


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an output path that would destroy something, before any model loads."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} is a file, not a folder; export into a new folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out_dir} is not empty; export into a new folder, or pass --overwrite to replace "
            "the agents' folders in it"
        )


def swap_in(new: Path, target: Path) -> None:
    """Move the complete folder ``new`` to ``target``; an existing one is replaced only once
    the new one is whole, so an interrupted export never leaves half a model there."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def export_run(
    run_dir: Path,
    out_dir: Path,
    merge: bool = False,
    overwrite: bool = False,
    push_to_hub: str | None = None,
    private: bool = False,
) -> dict[str, Path]:
    """Load the run's checkpoint and export every agent that has an LLM policy (and push
    them to the hub, ``push_to_hub`` naming the repository)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_out_dir(out_dir, overwrite)
    config = load_run_config(run_dir, {"device": "cpu"})
    if push_to_hub is not None:
        repos = hub.repo_ids(push_to_hub, list(config.seat_learners()))
        api = hub.check_hub()
    trained = build_trained(config, run_dir)
    game, learners = trained.game, trained.learners
    iteration = load_json_state(trained.checkpoint)["iteration"]
    seats = config.seat_learners()
    evaluation, base = final_evaluation(run_dir), base_evaluation(run_dir)
    exported = {}
    shared = seats_of(learners)
    for agent, learner in owners(learners).items():
        i = list(learners).index(agent)
        if len(shared[agent]) > 1:
            print(f"{', '.join(shared[agent][1:])}: {agent}'s policy (a learner shared by seats)")
        if not learner.exportable:
            print(f"{agent}: its learner has no LLM policy to export; skipped")
            continue
        info = {
            "run": str(run_dir),
            "iteration": iteration,
            "agent": agent,
            "model": config.seat_models()[agent],
        }
        partial = out_dir / f"{agent}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        learner.export(partial, game.tokenizers[i], merge, info)
        name, settings = seats[agent]
        contents = json.loads((partial / "cory_export.json").read_text())["contents"]
        card = model_card(
            config=config,
            agent=agent,
            learner_name=name,
            learner_settings=settings,
            updates=iteration + 1,
            contents=contents,
            evaluation=evaluation,
            base_evaluation=base,
        )
        card.save(partial / "README.md")
        swap_in(partial, out_dir / agent)
        exported[agent] = out_dir / agent
        print(f"{agent} -> {exported[agent]}")
    if push_to_hub is not None:
        hub.push_folders(api, exported, repos, private)
    return exported
