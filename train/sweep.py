"""Run a grid of training runs: ``python train/sweep.py --help``.

The command lives in ``cory_rl.train.commands.sweep``.
"""

from cory_rl.train.commands.sweep import main

if __name__ == "__main__":
    main()
