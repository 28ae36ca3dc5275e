"""What the built IMDB classifier's reward looks like (docs/tasks.md): its scale on held-out
queries, a few sentences' scores, and its accuracy on texts as short as the game's.

Reads the build in the cache (``python -m cory_env.imdb_classifier`` makes it) and the
embedded policy's tokenizer (the one the queries are cut with); prints:

- the ``imdb-classifier`` reward of the first 500 held-out queries alone (2-7 tokens);
- the reward of five sentences, two of them one word repeated;
- the accuracy on the first 24 classifier tokens of 1,000 held-out reviews (seed 0).

    python -m bench.imdb_classifier_scale
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from cory_env.imdb_classifier import classifier_dir, read_metadata
from cory_env.imdb_reviews import clean, load_reviews
from cory_env.models import embedded_model_dir
from cory_env.query import Query
from cory_env.rewards import make_reward
from cory_env.tasks.registry import make_task

SENTENCES = (
    "This movie was wonderful, I loved every minute of it.",
    "This movie was a boring mess.",
    "This movie was okay.",
    "This movie was" + " great" * 7,
    "This movie was" + " love" * 8,
)


def short_text_accuracy(n: int = 1000, tokens: int = 24, seed: int = 0) -> float:
    """Accuracy on the first ``tokens`` classifier tokens of ``n`` held-out reviews."""
    tokenizer = AutoTokenizer.from_pretrained(str(classifier_dir()))
    model = AutoModelForSequenceClassification.from_pretrained(str(classifier_dir())).eval()
    held_out = load_reviews("test")
    picked = [held_out[i] for i in np.random.default_rng(seed).choice(len(held_out), n, False)]
    right = 0
    with torch.no_grad():
        for start in range(0, n, 50):
            batch = picked[start : start + 50]
            texts = [
                tokenizer.decode(
                    tokenizer(clean(r.text), add_special_tokens=False)["input_ids"][:tokens]
                )
                for r in batch
            ]
            logits = model(**tokenizer(texts, return_tensors="pt", padding=True)).logits
            right += sum(
                int(g == r.label) for g, r in zip(logits.argmax(-1).tolist(), batch, strict=True)
            )
    return right / n


def main() -> None:
    record = read_metadata()
    print(f"build: held-out accuracy {record['held_out_accuracy']}, settings {record['settings']}")
    policy_tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    task = make_task(
        "imdb", dataset="imdb-reviews", reward="imdb-classifier", split="test",
        tokenizer=policy_tokenizer, n_queries=500,
    )  # fmt: skip
    reward = make_reward("imdb-classifier")
    queries = list(task.queries)[:500]
    scores = np.array(reward(queries, [""] * len(queries)))
    print(
        f"{len(queries)} held-out queries alone: mean {scores.mean():.2f}, sd "
        f"{scores.std(ddof=1):.2f}, min {scores.min():.2f}, max {scores.max():.2f}"
    )
    for text, score in zip(
        SENTENCES, reward([Query("")] * len(SENTENCES), list(SENTENCES)), strict=True
    ):
        print(f"{score:+.2f}  {text!r}")
    print(f"first 24 tokens of 1000 held-out reviews: accuracy {short_text_accuracy():.3f}")


if __name__ == "__main__":
    main()
