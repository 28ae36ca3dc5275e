"""Draw each run folder's learning curves into its ``curves.png``: ``python train/plots.py
RUN ...``. Runs side by side, with intervals over seeds: ``python train/compare.py``."""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.analysis.run_plots import plot_run
from cory_rl.train.commands.parser import ArgumentParser, path_errors_in_one_line, summary


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (Path(r) / "config.yaml").is_file()]
    if missing:
        parser.error(f"not a run folder (no config.yaml): {', '.join(missing)}")
    drawn = []
    try:
        for run in args.runs:
            drawn.append(plot_run(run))
            print(drawn[-1])
    except FileNotFoundError as err:
        parser.error(str(err))
    return drawn


if __name__ == "__main__":
    main()
