"""The core layer: the pieces a run is made of.

Processes (``distributed``), the run folder and its lock (``run_folder``), checkpoints,
compact results, the game and learners built from a config (``build``, ``games``), a
trained run loaded (``trained``), the loop's hooks (``callbacks``), early stopping, peak
memory and the errors a command prints in one line. It imports the config layer."""
