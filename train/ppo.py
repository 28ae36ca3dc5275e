"""Single-agent PPO baseline: one PPO agent in the one-agent game.

python train/ppo.py --preset smoke
python train/ppo.py --preset cpu
"""

import sys
from pathlib import Path

# Run as a script: import from the repository root, not from train/ (whose module
# names, e.g. config, would shadow other packages).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from train.run import main  # noqa: E402

if __name__ == "__main__":
    main("ppo")
