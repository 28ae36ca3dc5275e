"""Export a run's agents as Hugging Face model folders: ``python train/export.py RUN OUT
[--merge] [--push_to_hub OWNER/NAME]`` (``cory_rl.train.publish.export``).
"""

from __future__ import annotations

from pathlib import Path

from cory_rl.train.commands.parser import (
    ArgumentParser,
    output_folder,
    path_errors_in_one_line,
    summary,
)
from cory_rl.train.core.errors import USER_ERRORS, one_line
from cory_rl.train.publish.export import export_run


@path_errors_in_one_line
def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = ArgumentParser(description=summary(__doc__))
    parser.add_argument("run_dir", type=Path, help="a run folder with a checkpoint")
    parser.add_argument("out_dir", type=output_folder, help="a new folder for the exported agents")
    parser.add_argument("--merge", action="store_true", help="LoRA: merge adapters into weights")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the agents' folders in a used OUT_DIR"
    )
    parser.add_argument(
        "--push_to_hub",
        metavar="OWNER/NAME",
        help="upload each agent to this hub repository (several: NAME-<agent>)",
    )
    parser.add_argument("--private", action="store_true", help="with --push_to_hub: private")
    args = parser.parse_args(argv)
    if not (args.run_dir / "config.yaml").is_file():
        parser.error(f"{args.run_dir} is not a run folder (it has no config.yaml)")
    if args.private and args.push_to_hub is None:
        parser.error("--private applies to --push_to_hub; add --push_to_hub OWNER/NAME")
    try:
        return export_run(
            args.run_dir, args.out_dir, args.merge, args.overwrite, args.push_to_hub, args.private
        )
    except USER_ERRORS as err:
        parser.error(one_line(err).removeprefix("error: "))


if __name__ == "__main__":
    main()
