"""Compare runs: curves, tests, matched KL: ``python train/compare.py --help``.

The command lives in ``cory_rl.train.commands.compare``.
"""

from cory_rl.train.commands.compare import main

if __name__ == "__main__":
    main()
