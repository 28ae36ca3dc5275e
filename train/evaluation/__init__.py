"""The evaluation layer: the fixed held-out set and everything measured on it.

``eval_set`` (queries, budgets, sampling uniforms), ``evaluator`` (plays it, every agent in
every role), ``report`` (the tables of one evaluation, recomputed from its answers),
``measures`` (what answers show: distinct-n, repetition, pass@k), ``inference`` (intervals
and tests over seeds and queries), ``along`` (evaluations along training), ``cross_play``.
It imports the core and config layers."""
