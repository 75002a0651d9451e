"""`stapo export`: a saved training step as a Hugging Face model folder with a model card.

``locate`` picks the checkpoint step, ``card`` writes the model card, ``cli`` runs verl's FSDP
model merger (through ``stapo.verl_plugin.export.merger``) and assembles the folder.
"""

from stapo.export.cli import main

__all__ = ["main"]
