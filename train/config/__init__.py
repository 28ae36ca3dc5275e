"""The config layer, the lowest of ``cory_rl.train``: what a run is set up by.

``TrainConfig`` (``train_config``) with a help text on every field, how it is resolved from
its layers and the YAML dialect (``resolve``), the presets and algorithms, the checks of
the trackers, the heap allocator and whole-file writes. It imports only ``cory_env`` and
``cory_rl.agents``: never a run, a loop or a command."""
