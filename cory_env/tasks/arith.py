"""Arithmetic word problems generated here: a fully offline math task with tunable difficulty.

Difficulty is set by the largest operand, the number of chained steps and the
operations allowed. The easiest level (one step, operands 1-9, + and -) is meant to
be solvable some of the time by a 135M instruct model, so that RL has a signal.

Template convention (tests rely on it): each problem is one start sentence with the
first number, one sentence per step with that step's operand, and a question with no
number; gain steps say "more", multiplication steps say "times", loss steps say neither.

``style="equation"`` (not the default) draws the same problems but writes each query as
its bare expression, e.g. ``3+4`` or ``(3+4)*2`` (operations apply left to right, so a
multiplication after earlier steps is bracketed), with the compact prompts ``3+4=`` for
the pioneer and ``3+4[7]=`` for an observer shown the answer ``7``: prompts of a few
characters, for character-level tokenizers (``cory_env.small_vocab_tokenizer``) and small
policies.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cory_env import checks
from cory_env.query import Query
from cory_env.rewards import AnswerCheckReward
from cory_env.tasks.base import HeldOut, Task
from cory_env.tasks.registry import register_task

OPERATIONS = ("+", "-", "*")
EXAMPLE = (
    "Q: Tom has 2 apples and gets 3 more. How many apples does Tom have?\nA: The answer is 5.\n"
)
WORD_EXAMPLES = (
    EXAMPLE,
    "Q: Mia had 9 coins. Then Mia spent 4 coins at the shop. How many coins does Mia have "
    "now?\nA: The answer is 5.\n",
    "Q: There were 6 birds on a tree. Then 7 more birds landed on the tree. How many birds are "
    "on the tree now?\nA: The answer is 13.\n",
    "Q: A tank had 4 fish. Then Ana added 2 more fish to the tank. How many fish are in the "
    "tank now?\nA: The answer is 6.\n",
)
EQUATION_EXAMPLES = ("2+3=5\n", "9-4=5\n", "6+7=13\n", "4+2=6\n")
"""Solved examples put before the query (``shots``), written for this project; the same
sums in both styles. The words style shows one by default, the equation style none."""
REFERENCE_EXAMPLES = (
    "2+3=\nReference: 5\nAnswer: 5\n",
    "9-4=\nReference: 5\nAnswer: 5\n",
    "6+7=\nReference: 12\nAnswer: 13\n",
    "4+2=\nReference: 6\nAnswer: 6\n",
)
"""The same sums as the observer's solved examples in the reference form: the partner's
answer on its own labelled line before ``Answer:``, as the official GSM8K observer prompt
has it. One reference is wrong and corrected, as most of a base pioneer's are."""
OBSERVER_PROMPTS = ("bracket", "reference")
"""Values of the equation style's ``observer_prompt`` (module doc)."""


@dataclass(frozen=True)
class _Theme:
    """Sentence templates for one kind of thing; ``{c}`` is "3 apples", ``{m}`` "3 more apples"."""

    singular: str
    plural: str
    start: str
    gains: tuple[str, ...]
    losses: tuple[str, ...]
    question: str


THEMES = (
    _Theme(
        "apple",
        "apples",
        "{name} had {c}.",
        ("{name} picked {m} from a tree.", "a friend gave {name} {m}."),
        ("{name} ate {c}.", "{name} gave {c} to a neighbour."),
        "How many apples does {name} have now?",
    ),
    _Theme(
        "coin",
        "coins",
        "{name} had {c}.",
        ("{name} found {m} under the sofa.", "{name} earned {m} for doing chores."),
        ("{name} spent {c} at the shop.", "{name} lost {c} on the way home."),
        "How many coins does {name} have now?",
    ),
    _Theme(
        "marble",
        "marbles",
        "{name} had {c}.",
        ("{name} won {m} in a game.",),
        ("{name} lost {c} in a game.",),
        "How many marbles does {name} have now?",
    ),
    _Theme(
        "page",
        "pages",
        "A notebook had {c}.",
        ("{name} glued {m} into the notebook.",),
        ("{name} tore {c} out of the notebook.",),
        "How many pages does the notebook have now?",
    ),
    _Theme(
        "bird",
        "birds",
        "There were {c} on a tree.",
        ("{m} landed on the tree.",),
        ("{c} flew away.",),
        "How many birds are on the tree now?",
    ),
    _Theme(
        "cookie",
        "cookies",
        "{name} baked {c}.",
        ("{name} baked {m}.",),
        ("{name} ate {c}.", "{name} gave {c} to friends."),
        "How many cookies does {name} have now?",
    ),
    _Theme(
        "book",
        "books",
        "There were {c} on a shelf.",
        ("{name} put {m} on the shelf.",),
        ("{name} took {c} off the shelf.",),
        "How many books are on the shelf now?",
    ),
    _Theme(
        "sticker",
        "stickers",
        "{name} had {c}.",
        ("{name} bought {m}.",),
        ("{name} gave away {c}.", "{name} used {c} on a card."),
        "How many stickers does {name} have now?",
    ),
    _Theme(
        "car",
        "cars",
        "There were {c} in a parking lot.",
        ("{m} drove into the parking lot.",),
        ("{c} drove away.",),
        "How many cars are in the parking lot now?",
    ),
    _Theme(
        "fish",
        "fish",
        "A tank had {c}.",
        ("{name} added {m} to the tank.",),
        ("{name} moved {c} to a pond.",),
        "How many fish are in the tank now?",
    ),
    _Theme(
        "balloon",
        "balloons",
        "{name} had {c}.",
        ("{name} blew up {m}.",),
        ("{c} popped.",),  # past tense everywhere: no verb agreement to get wrong
        "How many balloons does {name} have now?",
    ),
    _Theme(
        "pencil",
        "pencils",
        "{name} had {c}.",
        ("{name} bought {m}.",),
        ("{name} gave {c} to a classmate.",),
        "How many pencils does {name} have now?",
    ),
)
NAMES = (
    "Tom",
    "Ana",
    "Ben",
    "Mia",
    "Leo",
    "Sara",
    "Omar",
    "Lily",
    "Sam",
    "Nina",
    "Raj",
    "Eva",
    "Max",
    "Zoe",
    "Kofi",
    "Lena",
    "Ivan",
    "Maya",
    "Hugo",
    "Aiko",
)
LATER = ("After that,", "Later,", "Next,", "Then")
STYLES = ("words", "equation")
"""Values of the ``style`` setting: word problems (default) or bare expressions."""
EQUATION_CONTEXT_LENGTH = 16
EQUATION_MAX_NEW_TOKENS = 4
"""Defaults of the equation style: an answer of up to 3 digits and an EOS, a short prompt."""


WHERE = "task 'arith'"


def _check_operations(operations: Iterable[str]) -> tuple[str, ...]:
    what = f"a non-empty selection of {OPERATIONS}"
    try:
        ops = tuple(operations)
    except TypeError:
        raise checks.fail("operations", what, operations, WHERE) from None
    if not ops or any(op not in OPERATIONS for op in ops):
        raise checks.fail("operations", what, ops, WHERE)
    return ops


def generate_arith_problems(
    n: int,
    *,
    max_operand: int = 9,
    n_steps: int = 1,
    operations: Sequence[str] = ("+", "-"),
    seed: int = 0,
    style: str = "words",
) -> list[Query]:
    """``n`` word problems of ``n_steps`` chained operations on operands 1..max_operand.

    Answers are never negative (a subtraction never takes away more than there is)
    and ``Query.answer`` is the exact integer as a string. Deterministic in ``seed``.
    ``style="equation"`` writes the same problems (same seed, same numbers) as bare
    expressions such as ``(3+4)*2``, evaluated left to right.
    """
    n = checks.integer(n, "n_queries", minimum=1, where=WHERE)
    max_operand = checks.integer(max_operand, "max_operand", minimum=1, where=WHERE)
    n_steps = checks.integer(n_steps, "n_steps", minimum=1, where=WHERE)
    ops = _check_operations(operations)
    seed = checks.integer(seed, "seed", minimum=0, where=WHERE)
    style = checks.choice(style, "style", STYLES, where=WHERE)
    only_sub = set(ops) == {"-"}
    if only_sub and max_operand < n_steps:
        raise checks.fail(
            "max_operand",
            f">= n_steps ({n_steps}) with only subtraction",
            max_operand,
            WHERE,
            f"{n_steps} subtractions need a start value of at least {n_steps}",
        )
    rng = np.random.default_rng(seed)

    def pick(options: Sequence[str]) -> str:
        return options[int(rng.integers(len(options)))]

    problems = []
    for _ in range(n):
        theme = THEMES[int(rng.integers(len(THEMES)))]
        name = pick(NAMES)

        def count(k: int, more: bool = False, theme: _Theme = theme) -> str:
            noun = theme.singular if k == 1 else theme.plural
            return f"{k} more {noun}" if more else f"{k} {noun}"

        value = int(rng.integers(n_steps if only_sub else 1, max_operand + 1))
        sentences = [theme.start.format(name=name, c=count(value))]
        expression = str(value)
        for step in range(n_steps):
            op = pick([o for o in ops if o != "-" or value >= 1])
            if op == "-":
                # With only subtraction, keep 1 in reserve for each later step.
                reserve = n_steps - step - 1 if only_sub else 0
                k = int(rng.integers(1, min(max_operand, value - reserve) + 1))
                value -= k
                text = pick(theme.losses).format(name=name, c=count(k))
                expression += f"-{k}"
            else:
                k = int(rng.integers(1, max_operand + 1))
                if op == "+":
                    value += k
                    text = pick(theme.gains).format(name=name, m=count(k, more=True))
                    expression += f"+{k}"
                else:
                    value *= k
                    text = f"the number of {theme.plural} became {k} times as large."
                    expression = f"{expression}*{k}" if step == 0 else f"({expression})*{k}"
            sentences.append(f"{'Then' if step == 0 else pick(LATER)} {text}")
        sentences.append(theme.question.format(name=name))
        words = " ".join(sentences)
        problems.append(Query(text=expression if style == "equation" else words, answer=str(value)))
    return problems


def arith_prompt(role: int, query: Query, earlier: Sequence[str], shots: int = 1) -> str:
    """Short few-shot prompt (``shots`` worked examples, one by default); observers also see
    the earlier answers they are given, one ``Reference answer: ...`` line each (in order)
    before ``A:``."""
    examples = "".join(WORD_EXAMPLES[:shots])
    if role == 0:
        return f"{examples}Q: {query.text}\nA:"
    if not earlier:
        raise ValueError(f"arith prompt for role {role} needs an earlier response; got none")
    references = "".join(f"Reference answer: {answer.strip()}\n" for answer in earlier)
    return f"{examples}Q: {query.text}\n{references}A:"


def arith_equation_prompt(role: int, query: Query, earlier: Sequence[str], shots: int = 0) -> str:
    """Compact prompt of the equation style: ``3+4=`` for the pioneer; an observer sees each
    earlier answer it is given in brackets, in order: ``3+4[7]=`` (``3+4[7][8]=``). With
    ``shots``, that many solved sums come first, one a line (``2+3=5\n3+4=``)."""
    examples = "".join(EQUATION_EXAMPLES[:shots])
    if role == 0:
        return f"{examples}{query.text}="
    if not earlier:
        raise ValueError(f"arith prompt for role {role} needs an earlier response; got none")
    return examples + query.text + "".join(f"[{answer.strip()}]" for answer in earlier) + "="


def arith_reference_prompt(role: int, query: Query, earlier: Sequence[str], shots: int = 0) -> str:
    """The equation style with the official GSM8K observer form: the pioneer as in
    :func:`arith_equation_prompt`; an observer sees ``3+4=``, then each earlier answer on
    a line of its own, ``Reference: 7`` (its whitespace made single spaces, so that an
    answer running into a new line stays on its line), then ``Answer:``; with ``shots``,
    that many solved examples of the same form come first."""
    if role == 0:
        return arith_equation_prompt(0, query, earlier, shots)
    if not earlier:
        raise ValueError(f"arith prompt for role {role} needs an earlier response; got none")
    references = "".join(f"Reference: {' '.join(answer.split())}\n" for answer in earlier)
    return "".join(REFERENCE_EXAMPLES[:shots]) + f"{query.text}=\n{references}Answer:"


HELD_OUT_SEED_OFFSET = 1
"""Evaluation problems come from the generator seed this far from training's."""


def arith_held_out(settings: dict[str, Any]) -> HeldOut:
    """Problems of another generator seed, minus any that training also draws."""
    seed = int(settings.get("seed", 0)) + HELD_OUT_SEED_OFFSET
    note = f"arith problems of generator seed {seed}, minus training's"
    return HeldOut({**settings, "seed": seed}, note, True, minus_training=True)


@register_task("arith", held_out=arith_held_out)
def make_arith_task(
    *,
    n_queries: int = 512,
    max_operand: int = 9,
    n_steps: int = 1,
    operations: Sequence[str] = ("+", "-"),
    seed: int = 0,
    max_new_tokens: int | tuple[int, int] | None = None,
    context_length: int | None = None,
    style: str = "words",
    shots: int | None = None,
    observer_prompt: str = "bracket",
) -> Task:
    """Generated arithmetic word problems scored by the GSM8K answer checker.

    ``operations`` is a selection of "+", "-", "*"; operands are 1..max_operand;
    ``n_steps`` operations are chained. Responses are expected as "The answer is N."

    ``style="equation"``: the same problems as bare expressions with the compact prompts of
    :func:`arith_equation_prompt`; responses are expected as just the number. The budget and
    context default to 24 and 192 tokens for words, 4 and 16 for equations.

    ``shots``: how many solved examples come before the query (words: 1 by default, up to
    4; equations: none by default, up to 4); each example beyond the default adds 48 tokens
    of context for words and 8 for equations. A lever on the base model's pass@1 as much as
    the difficulty is.

    ``observer_prompt`` (equation style): ``bracket`` shows an observer the answer inside
    the expression (``3+4[7]=``, a few characters, for small vocabularies); ``reference``
    in the official GSM8K form, on a labelled line of its own before ``Answer:``
    (:func:`arith_reference_prompt`; a context of 32 tokens and 16 more per shot).
    The words style always uses labelled references (:func:`arith_prompt`).
    """
    style = checks.choice(style, "style", STYLES, where=WHERE)
    equation = style == "equation"
    default_shots = 0 if equation else 1
    shots = default_shots if shots is None else shots
    shots = checks.integer(shots, "shots", minimum=0, where=WHERE)
    if shots > len(WORD_EXAMPLES):
        raise checks.fail(
            "shots",
            f"an integer from 0 to {len(WORD_EXAMPLES)}",
            shots,
            WHERE,
            f"the task has {len(WORD_EXAMPLES)} solved examples",
        )
    observer_prompt = checks.choice(
        observer_prompt, "observer_prompt", OBSERVER_PROMPTS, where=WHERE
    )
    reference = observer_prompt == "reference"
    if reference and not equation:
        raise checks.SettingError(
            f"{WHERE}: observer_prompt 'reference' is a form of the equation style (the "
            "words style labels its references already); set style: equation, or leave "
            "observer_prompt out"
        )
    queries = generate_arith_problems(
        n_queries,
        max_operand=max_operand,
        n_steps=n_steps,
        operations=operations,
        seed=seed,
        style=style,
    )
    if max_new_tokens is None:
        max_new_tokens = EQUATION_MAX_NEW_TOKENS if equation else 24
    if context_length is None:
        extra = max(shots - default_shots, 0) * (8 if equation else 48)
        context_length = (EQUATION_CONTEXT_LENGTH if equation else 192) + extra
        if reference:
            context_length = 32 + 16 * shots
    prompt = arith_equation_prompt if equation else arith_prompt
    if reference:
        prompt = arith_reference_prompt
    return Task(
        name="arith",
        queries=queries,
        reward_fn=AnswerCheckReward(),
        prompt_fn=prompt if shots == default_shots else functools.partial(prompt, shots=shots),
        max_new_tokens=max_new_tokens,
        context_length=context_length,
        metadata={
            "max_operand": max_operand,
            "n_steps": n_steps,
            "operations": tuple(operations),
            "seed": seed,
            "style": style,
            "shots": shots,
            "observer_prompt": observer_prompt,
        },
    )
