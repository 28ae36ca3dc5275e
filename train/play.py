"""Talk to a run's agents: ``python train/play.py --help`` (``cory_rl.train.commands.play``)."""

from cory_rl.train.commands.play import main

if __name__ == "__main__":
    main()
