"""The checks of a composed run config, on the driver before Ray or any worker starts (every run, GPU included).

A bad setting found here costs a second; found inside a worker it costs a cluster start-up. Nothing here runs in a
worker. See ``stapo/verl_plugin/__init__.py`` for the map.
"""
