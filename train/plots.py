"""Draw each run's learning curves: ``python train/plots.py --help``.

The command lives in ``cory_rl.train.commands.plots``.
"""

from cory_rl.train.commands.plots import main

if __name__ == "__main__":
    main()
