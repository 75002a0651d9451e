"""STAPO: Spurious-Token-Aware Policy Optimization on top of verl.

The core (``stapo.s2t``, ``stapo.loss``) is pure torch and imports nothing from verl;
``stapo.verl_plugin`` is the only package that touches verl internals.
"""

__version__ = "0.1.0"
