"""Export a run's agents as Hugging Face folders: ``python train/export.py --help``.

The command lives in ``cory_rl.train.commands.export``.
"""

from cory_rl.train.commands.export import main

if __name__ == "__main__":
    main()
