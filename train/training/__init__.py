"""The training layer: the loop (``loop``), the trackers it reports to (``trackers``), and
``run_training`` (``run``: a config to a run folder). It imports the analysis (a run's
curves and summary), evaluation, core and config layers (the evaluations along training,
handed to the loop as a callable)."""
