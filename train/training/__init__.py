"""The training layer: the loop, the update health it watches, the trackers it reports
to, and ``run_training`` (a config to a run folder). It imports the evaluation, core and
config layers (the evaluations along training, handed to the loop as a callable)."""
