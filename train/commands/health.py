"""Update health of runs: ``cory-health RUN_OR_FOLDER ...`` prints each run's medians of
approx_kl and clipfrac and the share of updates outside the band
(``cory_rl.train.core.health``).
"""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.commands.parser import ArgumentParser, summary
from cory_rl.train.core.health import Band, health_table


def main(argv: list[str] | None = None) -> str:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("paths", nargs="+", type=Path, help="run folders or folders of runs")
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
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such folder: {', '.join(missing)}")
    table = health_table(args.paths, Band(args.approx_kl, args.clipfrac))
    print(table)
    return table


if __name__ == "__main__":
    main()
