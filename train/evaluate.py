"""Evaluate runs on the fixed held-out set: ``python train/evaluate.py --help``.

The command lives in ``cory_rl.train.commands.evaluate``.
"""

from cory_rl.train.commands.evaluate import main

if __name__ == "__main__":
    main()
