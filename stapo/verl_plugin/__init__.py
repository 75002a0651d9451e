"""The verl glue: the only place in the project that imports verl internals.

verl is imported before any module of this package: ``import verl`` runs the ``verl.plugins`` entry
point (``stapo.verl_plugin.entry`` -> ``registration.register_all``), which hooks each registration to the
import of verl's module holding its registry (``import_hooks``). The hooks are in place before a glue module
imports verl's registries, so whichever glue module a process imports first, the registrations follow.
"""

import verl  # noqa: F401  (see above: installs the registration hooks before any glue module runs)
