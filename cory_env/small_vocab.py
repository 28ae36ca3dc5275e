"""Small-vocabulary mode: a character-level tokenizer and an arith game an MLP can learn.

An LLM tokenizer has tens of thousands of tokens, far too many actions for a small policy
trained from scratch. :func:`small_vocab_tokenizer` is a character-level
``transformers.PreTrainedTokenizerFast`` (built with the ``tokenizers`` library, so it
saves, reloads and feeds any Hugging Face model like any other tokenizer) with a pad, an
EOS and an unknown token. Its default alphabet holds just what the arith task's
*equation* style writes: digits and ``+-*()[]=``, 21 tokens in all::

    tok = cory_env.small_vocab_tokenizer()
    game = cory_env.batched_game(
        "arith", batch_size=64, tokenizer=tok, **cory_env.SMALL_VOCAB_ARITH
    )

:data:`SMALL_VOCAB_ARITH` are the settings of the small game: one-step problems on
operands 1..4 with ``+`` and ``-`` (every answer is one digit, 0..8), written as bare
expressions with the compact prompts ``3+4=`` (pioneer) and ``3+4[7]=`` (an observer
shown the answer ``7``), a budget of 2 tokens (a digit and EOS) and a context of 10
characters, which is the longest observer prompt (``4+4[12]=``, 8) plus the budget. The
default arith task (word problems, 192-token context) is unchanged; ``charset="text"``
covers its prompts too (every printable ASCII character and the newline) for a
character-level model that reads the word problems.

:class:`ArithScriptedPlayer` is a scripted seat for these games: it reads the expression
in its prompt and answers correctly with probability ``p_correct``.
"""

from __future__ import annotations

import ast
import string
from typing import Any

import numpy as np

from cory_env import checks

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""Ids 0, 1 and 2 of every small-vocabulary tokenizer, in this order."""

CHARSETS = {
    "equation": "0123456789+-*()[]=",
    "text": string.digits + string.ascii_letters + string.punctuation + " \n",
}
"""Named alphabets: ``equation`` (what the arith equation style writes: its prompts and
answers) and ``text`` (printable ASCII and the newline: also the word-problem prompts)."""

SMALL_VOCAB_ARITH: dict[str, Any] = {
    "style": "equation",
    "max_operand": 4,
    "operations": ("+", "-"),
    "n_steps": 1,
    "max_new_tokens": 2,
    "context_length": 10,
}
"""Arith settings of the small-vocabulary game (see the module docstring)."""


def small_vocab_tokenizer(charset: str = "equation") -> Any:
    """A character-level ``PreTrainedTokenizerFast``: one token per character.

    ``charset`` is a name in :data:`CHARSETS` or the characters themselves (each once).
    Ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2 (any character outside the alphabet), then
    the characters in the order given. Nothing is added around a text (no BOS/EOS), and
    decoding joins the characters with nothing between them, dropping the special tokens
    when asked (``skip_special_tokens=True``, as the game decodes answers).
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = CHARSETS.get(charset, charset)
    if not isinstance(chars, str) or not chars:
        raise checks.fail(
            "charset",
            f"one of {sorted(CHARSETS)} or a non-empty string of characters",
            charset,
            "small_vocab_tokenizer",
        )
    repeated = sorted({c for c in chars if chars.count(c) > 1})
    if repeated:
        raise ValueError(f"small_vocab_tokenizer: charset repeats the characters {repeated}")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for c in chars:
        vocab[c] = len(vocab)
    # BPE without merges and without a pre-tokenizer splits a text into its characters,
    # whitespace included; characters outside the alphabet become <unk>.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    pad, eos, unk = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=pad, eos_token=eos, unk_token=unk
    )


def evaluate_expression(text: str) -> int | None:
    """The value of an expression of non-negative integers, ``+ - *`` and brackets, or None.

    Parsed with :mod:`ast` and only those nodes allowed; ``eval`` is never used.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            return left - right if isinstance(node.op, ast.Sub) else left * right
        raise ValueError("not plain arithmetic")

    try:
        return value(tree.body)
    except (ValueError, RecursionError):
        return None


class ArithScriptedPlayer:
    """A scripted seat for the arith equation style with a character-level tokenizer.

    At the first token of its turn it decodes its prompt (``3+4=``, or ``3+4[7]=`` as an
    observer: the references are ignored), evaluates the expression and plans the answer:
    the right number with probability ``p_correct``, else a wrong one drawn uniformly from
    ``0..wrong_max`` (with the right one left out), then EOS; it spells the plan one
    character per step. A prompt it cannot evaluate gets a random wrong-or-right number.

    ``act(obs)`` takes a batched observation (as :class:`cory_rl.agents.base.Learner` does) and
    returns one token id per row; ``seed(n)`` reseeds it (the single-seat view calls it on
    a seeded reset).
    """

    def __init__(
        self, tokenizer: Any, p_correct: float = 1.0, seed: int = 0, wrong_max: int = 9
    ) -> None:
        where = "ArithScriptedPlayer"
        self.p_correct = checks.number(p_correct, "p_correct", minimum=0, maximum=1, where=where)
        self.wrong_max = checks.integer(wrong_max, "wrong_max", minimum=1, where=where)
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._plans: dict[int, list[int]] = {}
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def answer_for(self, prompt: str) -> str:
        """The answer this player plans for ``prompt`` (draws from its RNG)."""
        expression = prompt.split("[", 1)[0].split("=", 1)[0]
        right = evaluate_expression(expression)
        if right is not None and self.rng.random() < self.p_correct:
            return str(right)
        wrong = [k for k in range(self.wrong_max + 1) if k != right]
        return str(wrong[int(self.rng.integers(len(wrong)))])

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        ids = np.asarray(obs["input_ids"])
        mask = np.asarray(obs["attention_mask"]).astype(bool)
        generated = np.asarray(obs["num_generated"])
        tokens = np.full(len(ids), self.eos, dtype=np.int64)
        for row in range(len(ids)):
            step = int(generated[row])
            if step == 0:
                prompt = self.tokenizer.decode(ids[row][mask[row]], skip_special_tokens=True)
                answer = self.answer_for(prompt)
                self._plans[row] = [
                    *self.tokenizer(answer, add_special_tokens=False)["input_ids"],
                    self.eos,
                ]
            plan = self._plans.get(row, [self.eos])
            tokens[row] = plan[step] if step < len(plan) else self.eos
        return tokens

    def __call__(self, obs: dict[str, Any]) -> int:
        """One token for one (unbatched) observation, as the AEC env gives it."""
        batched = {k: np.asarray(v)[None] for k, v in obs.items()}
        return int(self.act(batched)[0])
