"""STAPO: Spurious-Token-Aware Policy Optimization on top of verl.

The core (``stapo.algorithm.s2t``, ``stapo.algorithm.loss``) is pure torch and imports nothing from verl;
``stapo.verl_plugin`` is the only package that touches verl internals.
"""

__version__ = "0.1.0"
