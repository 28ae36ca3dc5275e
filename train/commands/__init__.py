"""The commands: the command lines of training, evaluation, export, play, sweeps,
comparison, plots, health and tuning, their parsers and the console scripts (``cli``).
Each parses, calls the layers below, and turns a user's mistake into one line. Nothing
imports a command but the entry files at ``train/``'s root and ``cory_rl``."""
