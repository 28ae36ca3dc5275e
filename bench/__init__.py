"""The benchmarks: where a run's time and memory go, and ratios measured within one run
(the figures and the commands that gave them: docs/benchmarks.md).

Each ``bench_*.py`` is a module run from the repository's root as ``python -m
bench.bench_train ...`` (no ``sys.path`` edits: ``-m`` finds the package ``bench`` there, and
a script's own processes are started the same way), and takes ``--smoke``:
the same path at its smallest real setting, in seconds on a CPU (``tests/test_bench_smoke.py``
runs every script so). What the scripts share lives in one module each, imported the
ordinary way (``from bench.measure import Recorder``):

- ``measure``: the phase recorder, the learners' probe, FLOP counts and the matmul peak;
- ``provenance``: which code a bench measured (the commit, and changes to it);
- ``smoke``: the ``--smoke`` flag and its tiny model.
"""
