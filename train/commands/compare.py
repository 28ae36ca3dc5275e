"""Compare runs: seeds grouped, learning curves, held-out trajectories, tests per comparison.

python train/compare.py RUN_DIR [RUN_DIR ...] [--out DIR]   # or a sweep folder
python train/compare.py runs/sweep --point pioneer --baseline ppo --at_kl 2 5 10

What it writes: ``cory_rl.train.analysis.compare_runs``.
"""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.analysis.compare_runs import compare
from cory_rl.train.commands.parser import (
    ArgumentParser,
    number_at_least,
    output_folder,
    path_errors_in_one_line,
    summary,
)


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--out", type=output_folder, help="folder for the PNG and CSV files")
    parser.add_argument(
        "--point", default="pioneer", help="a run's frontier point: a role (pioneer...) or all"
    )
    parser.add_argument(
        "--eta", type=number_at_least(0), help="recompute r - eta*KL (default: as logged)"
    )
    parser.add_argument("--band", choices=("minmax", "std"), default="minmax")
    parser.add_argument(
        "--baseline",
        help="the group the others are tested against "
        "(a label or an algorithm; default the first group)",
    )
    parser.add_argument(
        "--at_kl",
        type=number_at_least(0, above=True),  # at KL 0 every policy is the reference
        nargs="+",
        help="held-out KLs of the matched comparison (default: 4 up to the "
        "largest KL every seed reaches)",
    )
    args = parser.parse_args(argv)
    try:
        written = compare(
            args.runs, args.out, args.point, args.eta, args.band, args.baseline, args.at_kl
        )
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
