"""Pick a setting per algorithm from pilot runs: ``cory-tune PILOTS --setting learning_rate``
(the rule: ``cory_rl.train.analysis.tuning``).
"""

from __future__ import annotations

from cory_rl.train.analysis.tuning import Pilot, pick, read_pilot, table
from cory_rl.train.commands.parser import (
    ArgumentParser,
    existing_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.core.health import Band


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> dict[str, Pilot | None]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument(
        "pilots", type=existing_folder, help="a folder of pilot runs (or their results)"
    )
    parser.add_argument("--setting", required=True, help="the setting the pilots vary")
    parser.add_argument("--by", default="pioneer/score", help="the training number to rank by")
    parser.add_argument("--last", type=int, default=10, help="iterations averaged, from the end")
    parser.add_argument("--tie", type=float, default=0.01, help="closer than this is a tie")
    args = parser.parse_args(argv)
    runs = sorted(
        {
            p.parent
            for pattern in ("metrics.jsonl", "metrics.jsonl.gz")
            for p in args.pilots.glob(f"*/{pattern}")
        }
    )
    if not runs:
        parser.error(f"{args.pilots} holds no run folders")
    try:
        pilots = [read_pilot(r, args.setting, args.by, args.last, Band()) for r in runs]
    except (ValueError, AttributeError) as err:
        parser.error(str(err))
    picked = pick(pilots, args.tie)
    print(table(pilots, picked, args.setting, args.by, args.last))
    for algorithm, p in picked.items():
        choice = "no healthy value" if p is None else f"{args.setting} {p.value:g}"
        print(f"{algorithm}: {choice}")
    return picked


if __name__ == "__main__":
    main()
