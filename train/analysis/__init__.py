"""The analysis layer: reading finished runs.

Comparisons of groups of runs (``comparison``, ``trajectories``, ``compare_runs``,
``figures``), a run's curves (``run_plots``) and summary (``run_summary``), and the tuning
rule that picks a setting from pilots (``tuning``). It imports the evaluation, core and
config layers."""
