"""Single-agent PPO baseline: one PPO agent in the one-agent game.

python train/ppo.py --preset smoke
python train/ppo.py --preset cpu
"""

from cory_rl.train.commands.train import main

if __name__ == "__main__":
    main("ppo")
