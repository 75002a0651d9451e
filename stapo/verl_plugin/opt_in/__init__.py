"""Speed-ups a setting turns on: the CPU presets do, the GPU presets do not (tests/unit/test_plugin_folders.py).

Each is off unless its setting says true, and each changes no number: ``stapo.one_server_direct`` (requests
straight to the one rollout server, ``one_server``), ``stapo.reward_in_agent_loop`` (rule-based rewards scored in
the agent-loop worker, ``local_reward``), ``stapo.tq_group_puts`` (a prompt group's samples put into TransferQueue
at once, ``group_puts``). See ``stapo/verl_plugin/__init__.py`` for the map.
"""
