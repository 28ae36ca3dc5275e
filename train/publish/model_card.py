"""The model card of an exported agent: a ``README.md`` with the Hub's metadata header.

It says what the folder is (the seat, the roles it played, the algorithm and learner, the
base model), how it was trained (the game's and the learner's settings, the length), how
it did on the held-out set if the run was evaluated, and how to load the policy and the
value head. Written with ``huggingface_hub``'s ``ModelCard``, so the Hub and
``ModelCard.load`` read its metadata.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from cory_env.core import role_name, roles_for_episode
from cory_rl.train.evaluation.report import REFERENCE, concat, summarise

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The hub id of the embedded model (``model: embedded``), for the card's ``base_model``."""


def _count(n: int, noun: str) -> str:
    plural = {"query": "queries"}.get(noun, noun + "s")
    return f"{n} {noun if n == 1 else plural}"


def roles_played(agent_index: int, n_agents: int, period: int, updates: int) -> dict[str, int]:
    """How many training iterations the agent spent in each role."""
    counts: dict[str, int] = {}
    for episode in range(updates):
        role = roles_for_episode(episode, n_agents, period)[agent_index]
        name = role_name(role, n_agents)
        counts[name] = counts.get(name, 0) + 1
    return counts


def _held_out_rows(
    evaluation: dict[str, Any] | None, agent: str, base: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """This agent's held-out numbers per role, and the base model's in the same seat: from
    the evaluation's own base rows, or from ``base`` (the evaluation before training)."""
    if not evaluation or "answers" not in evaluation:
        return []
    answers = evaluation["answers"]
    if REFERENCE not in answers["model"] and base is not None and "answers" in base:
        answers = concat(answers, base["answers"])
    rows, _ = summarise(answers, checked=evaluation.get("answer_checked", False))
    return [r for r in rows if r["agent"] == agent]


def _evaluation_table(rows: list[dict[str, Any]], evaluation: dict[str, Any]) -> str:
    def interval(cell: dict[str, Any] | None) -> str:
        if not cell:
            return "n/a"
        low, high = cell.get("ci95") or (None, None)
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
        return f"{cell['mean']:.3f}{ci}"

    lines = [
        "| model | role | reward (95% CI over queries) | reward - base | KL to base |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        model = "base model" if row["model"] == REFERENCE else "this agent"
        lines.append(
            f"| {model} | {row['role']} | {interval(row['reward'])} | "
            f"{interval(row.get('reward_minus_base'))} | {interval(row.get('kl'))} |"
        )
    held_out = evaluation.get("held_out", {})
    eval_set = evaluation.get("eval_set", {})
    updates = evaluation.get("updates")
    when = f" after {updates} updates" if updates is not None else ""
    return "\n".join(
        [
            textwrap.fill(
                f"Evaluated{when} on {held_out.get('note', 'held-out queries')}: "
                f"{_count(len(eval_set.get('queries', [])), 'query')}, "
                f"{_count(eval_set.get('samples', 0), 'answer')} to each per role; the base model "
                "answered with the same random numbers (common random numbers), and the intervals "
                "are bootstraps over queries.",
                width=90,
                break_on_hyphens=False,
            ),
            "",
            *lines,
        ]
    )


def model_card(
    *,
    config: Any,
    agent: str,
    learner_name: str,
    learner_settings: Any,
    updates: int,
    contents: str,
    evaluation: dict[str, Any] | None = None,
    base_evaluation: dict[str, Any] | None = None,
) -> Any:
    """The card of one exported agent of a run (a ``huggingface_hub.ModelCard``)."""
    from huggingface_hub import ModelCard, ModelCardData

    index = config.agents.index(agent)
    game = config.game
    base = config.seat_models()[agent]
    base_id = EMBEDDED_HUB_ID if base == "embedded" else base
    roles = roles_played(index, game.n_agents, game.role_exchange_period, updates)
    settings = dataclasses.asdict(learner_settings) if learner_settings is not None else {}
    lora = contents == "LoRA adapter"
    data = ModelCardData(
        base_model=base_id,
        library_name="peft" if lora else "transformers",
        pipeline_tag="text-generation",
        tags=["cory", "reinforcement-learning", "multi-agent", config.algorithm, learner_name],
        model_name=f"{config.algorithm} {agent} ({config.task})",
    )
    played = ", ".join(f"{role} for {_count(n, 'iteration')}" for role, n in roles.items())
    game_rows = "\n".join(f"| `{k}` | `{v}` |" for k, v in dataclasses.asdict(game).items())
    learner_rows = "\n".join(f"| `{k}` | `{v}` |" for k, v in settings.items())
    rows = _held_out_rows(evaluation, agent, base_evaluation)
    held_out = (
        _evaluation_table(rows, evaluation)
        if rows
        else "The run was not evaluated on held-out queries (`python train/evaluate.py RUN`)."
    )
    exchange = (
        f"roles exchange every {_count(game.role_exchange_period, 'iteration')}; "
        if game.n_agents > 1
        else ""
    )
    intro = textwrap.fill(
        f"Seat `{agent}` of a {game.n_agents}-agent text game trained with `{config.algorithm}` "
        f"(learner `{learner_name}`), exported by the `cory` library: {contents}, fine-tuned "
        f"from `{base_id}`. In training it played {played} ({exchange}the pioneer answers the "
        "query alone, an observer answers after seeing the earlier answers). Each agent was "
        f"paid `r_self + lam * sum(r_others)` with `lam = {game.lam}`. Training: "
        f"{_count(updates, 'iteration')} of {config.batch_size} games, seed {config.seed}, task "
        f"`{config.task}` with settings `{config.task_settings}`.",
        width=90,
        break_on_hyphens=False,
    )
    body = f"""
# {config.algorithm} agent `{agent}` on `{config.task}`

{intro}

## Held-out evaluation

{held_out}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

The critic is `value_head.safetensors` beside the weights: a linear layer (`weight`,
`bias`) on the last hidden state of the final layer, giving V(s).

```python
import torch
from safetensors.torch import load_file

head = load_file("path/to/this/folder/value_head.safetensors")
hidden = model(**tokenizer("Hello", return_tensors="pt"), output_hidden_states=True)
values = hidden.hidden_states[-1] @ head["weight"].T + head["bias"]
```

## Settings

| game setting | value |
|---|---|
{game_rows}

| learner setting | value |
|---|---|
{learner_rows}
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
