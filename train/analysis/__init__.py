"""The analysis layer: reading finished runs.

Comparisons of groups of runs (``comparison``, ``trajectories``, ``tables``, ``figures``),
a run's curves (``run_plots``) and summary (``run_summary``), and the tuning rule that
picks a setting from pilots. It imports the evaluation, training, core and config layers."""
