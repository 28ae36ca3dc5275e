"""Update health of runs: ``cory-health RUN_OR_FOLDER ...`` prints each run's medians of
approx_kl and clipfrac and the share of updates outside the band
(``cory_rl.train.core.health``).
"""

from __future__ import annotations

from cory_rl.train.commands.parser import (
    ArgumentParser,
    existing_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.core.health import Band, health_table


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> str:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument(
        "paths", nargs="+", type=existing_folder, help="run folders or folders of runs"
    )
    parser.add_argument(
        "--approx_kl",
        type=float,
        default=Band.approx_kl,
        help=f"an update above this approx_kl is outside the band (default {Band.approx_kl})",
    )
    parser.add_argument(
        "--clipfrac",
        type=float,
        default=Band.clipfrac,
        help=f"an update above this clipfrac is outside the band (default {Band.clipfrac})",
    )
    args = parser.parse_args(argv)
    table = health_table(args.paths, Band(args.approx_kl, args.clipfrac))
    print(table)
    return table


if __name__ == "__main__":
    main()
