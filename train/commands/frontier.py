"""A frontier over a setting: each arm's held-out (KL, reward) as the setting varies, at
matched KL with tests, and the collapse signals along training.

python -m cory_rl.train.commands.frontier RESULTS --setting init_kl_coef   # or cory-frontier
python -m cory_rl.train.commands.frontier RESULTS --setting init_kl_coef --at_kl 2 4 8

What it writes: ``cory_rl.train.analysis.frontier``.
"""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.analysis.frontier_report import report
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
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, results or sweep folders")
    parser.add_argument(
        "--setting", required=True, help="the setting the runs vary (e.g. init_kl_coef)"
    )
    parser.add_argument(
        "--out",
        type=output_folder,
        help="folder for the tables and figure (default: frontier/ beside the first folder)",
    )
    parser.add_argument(
        "--point",
        default="pioneer",
        help="a role (every agent's plays in it, pooled), all, an agent (its plays in every "
        "role) or AGENT/ROLE (e.g. llm_1/pioneer)",
    )
    parser.add_argument(
        "--baseline", help="the arm the others are tested against (default: ppo, else the first)"
    )
    parser.add_argument(
        "--baseline_point",
        help="the baseline arm's point, where it differs from --point (e.g. --point "
        "llm_1/pioneer --baseline_point pioneer: one of CORY's agents against PPO)",
    )
    parser.add_argument(
        "--at_kl",
        type=number_at_least(0, above=True),  # at KL 0 every policy is the reference
        nargs="+",
        help="held-out KLs of the matched comparison (default: 5 up to the largest KL every "
        "counted seed reaches)",
    )
    args = parser.parse_args(argv)
    out = args.out or args.runs[0].resolve().parent / "frontier"
    try:
        written = report(
            args.runs,
            args.setting,
            out,
            args.point,
            args.baseline,
            args.at_kl,
            args.baseline_point,
        )
    except (FileNotFoundError, ValueError, AttributeError) as err:
        parser.error(str(err))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
