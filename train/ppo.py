"""Single-agent PPO baseline: one PPO agent in the one-agent game.

python train/ppo.py --preset smoke
python train/ppo.py --preset cpu
"""

import sys

from cory_rl.train.config import allocator

if __name__ == "__main__":
    allocator.relaunch_for(sys.argv[1:])  # first: a re-execution then repeats no import
    from cory_rl.train.commands.train import main

    main("ppo")
