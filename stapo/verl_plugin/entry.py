"""Imported by ``import verl`` in every process (driver, TaskRunner, Ray workers).

Loaded through the ``verl.plugins`` entry point of the installed package. verl swallows plugin
import errors (logged at DEBUG only), so ``stapo.verl_plugin.registration.assert_registered``
checks the result at start-up.
"""

from stapo.verl_plugin.registration import register_all

register_all()
