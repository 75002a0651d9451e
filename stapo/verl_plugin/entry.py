"""Imported by ``import verl`` in every process through the ``verl.plugins`` entry point."""
