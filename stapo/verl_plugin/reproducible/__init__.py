"""Seeded rollouts: the seeded agent loop and the submission-order replay buffer (every run, GPU included).

Set by ``pin_reproducibility`` unless ``stapo.seeded_rollouts=false``, which keeps verl's own agent loop and
completion-order replay (docs/reproducibility.md). See ``stapo/verl_plugin/__init__.py`` for the map.
"""
