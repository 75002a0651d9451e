"""The verl glue: the only place in the project that imports verl internals.

verl is imported before any module of this package: ``import verl`` runs the ``verl.plugins`` entry
point (``stapo.verl_plugin.entry`` -> ``registration.register_all``), which imports the losses and the
trainer. Had a module of this package been first (``driver_diagnostics`` -> ``losses`` -> ``import verl``), the
entry point would run while that module is half-imported; the trainer's import of it then fails, verl
swallows the error, and trainer ``stapo`` is silently missing from the process.
"""

import verl  # noqa: F401  (see above: registers STAPO before any glue module is half-imported)
