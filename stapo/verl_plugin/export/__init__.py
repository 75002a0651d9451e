"""``stapo export`` only: an FSDP checkpoint as a Hugging Face folder through verl's model merger (no training run
imports it). See ``stapo/verl_plugin/__init__.py`` for the map.
"""
