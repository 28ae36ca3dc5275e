"""CORY: two PPO agents in the cooperative two-agent game with role exchange.

python train/cory.py --preset smoke
python train/cory.py --preset cpu
python train/cory.py --preset paper-imdb          # GPT2-Large, one GPU
python train/cory.py --resume runs/cory-imdb-...  # continue a run
"""

import sys
from pathlib import Path

# Run as a script: import from the repository root, not from train/ (whose module
# names, e.g. config, would shadow other packages).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from train.run import main  # noqa: E402

if __name__ == "__main__":
    main("cory")
