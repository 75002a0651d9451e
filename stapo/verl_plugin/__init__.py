"""The verl glue: the only place in the project that imports verl internals. Its folders say who runs what.

=================  ==============================================================================================
folder             what runs it
=================  ==============================================================================================
(this folder)      every process of every run: the ``verl.plugins`` entry point (``entry``), the registrations
                   (``registration``) and the import hooks they wait on (``import_hooks``)
``training/``      every run, on GPUs as on the CPU: the STAPO trainer, its actor worker (the token mask folded
                   into each shard), the registered loss, Lopti's two updates, the driver's diagnostics, the
                   loggers, the weight-sync deadline, validation at further decodings, the shared agent loops
``preflight/``     every run, on the driver, before Ray starts: the config and batch-size checks
``reproducible/``  runs with ``stapo.seeded_rollouts=true`` (the CPU presets; an opt-in on a GPU): the seeded
                   agent loop and the submission-order replay buffer that make one config and seed give the same
                   rollouts
``opt_in/``        only when a setting turns it on (the CPU presets do; the GPU presets do not): one rollout
                   server reached directly, rewards scored in the agent-loop worker, a group's samples put at once
``cpu/``           only the CPU back-end (``STAPO_CPU_BACKEND=1`` or ``trainer.device=cpu``): verl's platform on
                   the CPU, the HF-generate rollout, vLLM's CPU build; a GPU run never imports it
``export/``        ``stapo export`` only: verl's model merger
=================  ==============================================================================================

tests/unit/test_plugin_folders.py keeps the map true: the GPU presets turn on nothing of ``opt_in/`` and nothing
outside ``cpu/`` imports ``cpu/``.

verl is imported before any module of this package: ``import verl`` runs the ``verl.plugins`` entry
point (``stapo.verl_plugin.entry`` -> ``registration.register_all``), which hooks each registration to the
import of verl's module holding its registry (``import_hooks``). The hooks are in place before a glue module
imports verl's registries, so whichever glue module a process imports first, the registrations follow.
"""

import verl  # noqa: F401  (see above: installs the registration hooks before any glue module runs)
