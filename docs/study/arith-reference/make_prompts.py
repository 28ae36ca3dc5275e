# python docs/study/arith-reference/make_prompts.py  (from the repository root)
"""The observer's prompt in the study's arith game, with the base model's answers from the
committed base evaluation: one game whose pioneer was right, one whose pioneer was wrong."""

import gzip
import json

from cory_env.query import Query
from cory_env.tasks import make_task

SETTINGS = {"style": "equation", "shots": 4, "n_queries": 128, "observer_prompt": "reference"}
task = make_task("arith", **SETTINGS)
ev = json.loads(gzip.decompress(open("docs/study/arith-reference/base/eval.json.gz", "rb").read()))
a = ev["answers"]
n = len(a["model"])
games = {}
for i in range(n):
    key = (a["query"][i], a["sample"][i])
    games.setdefault(key, {})[(a["role"][i], a["agent"][i])] = i
queries = ev["eval_set"]["queries"]
shown = {True: 0, False: 0}
out = [
    "# The observer's prompt in the sums study (`observer_prompt: reference`)",
    "",
    "Made by the task's own prompt function (`cory_env/tasks/arith.py`, "
    f"`{json.dumps(SETTINGS)}`) from games of the committed base evaluation "
    "(`base/eval.json.gz`, llm_0 as the pioneer): each block is the exact text the model "
    "reads, between the fences.",
    "",
]
for (q, s), cell in sorted(games.items()):
    p, o = cell.get(("pioneer", "llm_0")), cell.get(("observer", "llm_1"))
    if p is None or o is None:
        continue
    right = a["reward"][p] >= 1.0
    if shown[right] >= 2:
        continue
    shown[right] += 1
    text = queries[q] if isinstance(queries[q], str) else queries[q]["text"]
    query = Query(text)
    pioneer_prompt = task.prompt_fn(0, query, [])
    observer_prompt = task.prompt_fn(1, query, [a["text"][p]])
    out += [
        f"## Query `{text}`, the pioneer {'right' if right else 'wrong'} (sample {s})",
        "",
        "Pioneer's prompt:",
        "",
        "```",
        pioneer_prompt,
        "```",
        "",
        f"Pioneer's answer: `{a['text'][p]!r}` (reward {a['reward'][p]:g})",
        "",
        "Observer's prompt:",
        "",
        "```",
        observer_prompt,
        "```",
        "",
        f"Observer's answer: `{a['text'][o]!r}` (reward {a['reward'][o]:g})",
        "",
    ]
    if all(v >= 2 for v in shown.values()):
        break
open("docs/study/arith-reference/prompts.md", "w").write("\n".join(out))
print("\n".join(out))
