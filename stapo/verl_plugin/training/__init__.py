"""What every run executes, on GPUs as on the CPU: the trainer, the actor worker, the loss, the diagnostics.

A GPU user's step runs this folder's code (and ``preflight/`` on the driver before it, ``reproducible/``'s seeded
loop unless turned off); nothing here imports ``cpu/``. See ``stapo/verl_plugin/__init__.py`` for the map.
"""
