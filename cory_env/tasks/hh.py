"""Anthropic-HH dialogues, the benchmark the CORY authors' rebuttal adds: answer the
conversation's last human turn, scored by a learned reward model.

A query is the conversation up to its last ``Assistant:`` turn (of the ``chosen``
transcript, as HH fine-tuning studies cut it); the reply is scored by a reward model given
that conversation and the reply (``cory_env/reward_model.py``). The data comes through
``datasets`` from a hub (``Anthropic/hh-rlhf``: splits train and test) or from a local
JSON(L) file of the same format: records with ``chosen`` (and ``rejected``, unused), or
with the conversation itself as ``prompt``. Nothing is packaged: HH's texts are Anthropic's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cory_env import checks
from cory_env.query import Query
from cory_env.reward_model import DEFAULT_HH_REWARD_MODEL, RewardModelScore
from cory_env.rewards import REWARD_NAMES, RewardCallable, make_reward
from cory_env.tasks.base import HeldOut, Task, is_local_file, select_count
from cory_env.tasks.files import (
    dataset_name,
    dataset_records,
    text_field,
)
from cory_env.tasks.registry import register_task
from cory_env.user_rewards import is_user_reward

HUB_DATASET = "Anthropic/hh-rlhf"
ASSISTANT = "\n\nAssistant:"
HUMAN = "\n\nHuman:"
OBSERVER_TEMPLATE = "{conversation}\n\nA draft reply: {draft}{assistant}"
"""The observer's prompt: the conversation, the pioneer's reply offered as a draft, and the
assistant's turn again (the draft is to be improved, not continued)."""
_OFFLINE_HINT = (
    f"Download it where a hub is reachable (`hf download {HUB_DATASET} --repo-type dataset "
    "--local-dir DIR`) and set task_settings dataset: DIR/harmless-base/train.jsonl (or "
    "helpful-base/...; gunzip the .jsonl.gz files first), or give any JSON(L) file whose "
    "records hold 'chosen' or 'prompt'"
)


def conversation_prompt(transcript: str) -> str:
    """The transcript up to and including its last ``Assistant:`` (the reply to write)."""
    cut = transcript.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError("it has no '\\n\\nAssistant:' turn")
    prompt = transcript[: cut + len(ASSISTANT)]
    if HUMAN not in prompt:
        raise ValueError("it has no '\\n\\nHuman:' turn before its last 'Assistant:'")
    return prompt


def hh_prompt(role: int, query: Query, earlier: Sequence[str]) -> str:
    """Pioneer: the conversation, ending ``Assistant:``. Observer: the same with the
    earlier replies as drafts (one ``A draft reply:`` each, in order)."""
    if role == 0:
        return query.text
    if not earlier:
        raise ValueError(f"hh prompt for role {role} needs an earlier response; got none")
    conversation = query.text[: -len(ASSISTANT)]
    drafts = "".join(f"\n\nA draft reply: {answer.strip()}" for answer in earlier[:-1])
    return OBSERVER_TEMPLATE.format(
        conversation=conversation + drafts, draft=earlier[-1].strip(), assistant=ASSISTANT
    )


def hh_reward(reward: str | RewardCallable, reward_input: str) -> RewardCallable:
    """A reward model for a model id or folder; any other reward as ``make_reward`` takes."""
    if callable(reward) or is_user_reward(reward) or reward in REWARD_NAMES:
        return make_reward(reward)
    checks.text(reward, "reward", where="task 'hh'", hint="a reward model id or folder")
    return RewardModelScore(reward, reward_input)


def hh_held_out(settings: dict[str, Any]) -> HeldOut:
    """The hub dataset's test split; a local file has one split."""
    dataset = settings.get("dataset", HUB_DATASET)
    if is_local_file(dataset):
        return HeldOut(
            settings,
            f"the local file {dataset} has one split: training queries, not held out",
            False,
        )
    return HeldOut({**settings, "split": "test"}, f"split 'test' of dataset {dataset}", True)


@register_task("hh", held_out=hh_held_out)
def make_hh_task(
    *,
    dataset: str = HUB_DATASET,
    split: str = "train",
    reward: str | RewardCallable = DEFAULT_HH_REWARD_MODEL,
    reward_input: str = "pair",
    n_queries: int | None = None,
    max_prompt_chars: int = 1000,
    max_new_tokens: int | tuple[int, int] = (16, 48),
    context_length: int = 512,
) -> Task:
    """Anthropic-HH: ``dataset`` a hub id (``Anthropic/hh-rlhf``) or a local JSON(L) file.

    ``reward``: a sequence-classification model with one output (a hub id or a local
    folder; default OpenAssistant's DeBERTa reward model), scored on (conversation, reply)
    as ``reward_input`` says (``pair``, or ``text`` for one string); or any reward the
    other tasks take (``file.py:function``, ``module:function``, a reward server's URL,
    a callable). ``max_prompt_chars`` keeps conversations of at most that many characters
    (0 keeps all), so that a prompt fits ``context_length`` tokens. ``n_queries`` keeps
    the first n. ``max_new_tokens=(low, high)`` draws a budget in ``low..high-1`` per game.
    """
    name = "hh"
    where = f"task {name!r}"
    dataset = dataset_name(dataset, where)
    if dataset is None:
        raise checks.SettingError(
            f"{where}: no packaged data (HH's texts are Anthropic's); set dataset to "
            f"{HUB_DATASET!r} or a local JSON(L) file. " + _OFFLINE_HINT
        )
    split = checks.text(split, "split", where=where)
    max_prompt_chars = checks.integer(
        max_prompt_chars, "max_prompt_chars", minimum=0, where=where, hint="0 keeps all"
    )
    if n_queries is not None:
        n_queries = checks.integer(n_queries, "n_queries", minimum=1, where=where)
    reward_fn = hh_reward(reward, reward_input)
    source, records = dataset_records("hh", dataset, split, _OFFLINE_HINT)
    queries, too_long = [], 0
    for record in records:
        field = "chosen" if "chosen" in record.data else "prompt"
        if field not in record.data:
            raise checks.DataError(
                f"{source}, {record.place} needs a 'chosen' (HH format) or 'prompt' field; it "
                f"has {sorted(record.data)}"
            )
        try:
            prompt = conversation_prompt(text_field(record, field, source))
        except ValueError as err:
            raise checks.DataError(f"{source}, {record.place}: {field!r}: {err}") from None
        if max_prompt_chars and len(prompt) > max_prompt_chars:
            too_long += 1
            continue
        queries.append(Query(text=prompt))
        if n_queries is not None and len(queries) == n_queries:
            break
    if not queries:
        raise checks.DataError(
            f"{source}: none of its conversations is at most {max_prompt_chars} characters "
            f"({too_long} longer); raise max_prompt_chars or set it to 0"
        )
    count = select_count(name, len(queries), n_queries)
    return Task(
        name=name,
        queries=queries[:count],
        reward_fn=reward_fn,
        prompt_fn=hh_prompt,
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={"source": dataset, "split": split, "reward": str(reward)},
    )
