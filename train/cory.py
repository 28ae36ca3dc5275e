"""CORY: two PPO agents in the cooperative two-agent game with role exchange.

python train/cory.py --preset smoke
python train/cory.py --preset cpu
python train/cory.py --preset paper-imdb          # GPT2-Large, one GPU
python train/cory.py --resume runs/cory-imdb-...  # continue a run
"""

import sys

from cory_rl.train.config import allocator

if __name__ == "__main__":
    allocator.relaunch_for(sys.argv[1:])  # first: a re-execution then repeats no import
    from cory_rl.train.commands.train import main

    main("cory")
