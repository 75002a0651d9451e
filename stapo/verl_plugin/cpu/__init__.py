"""CPU back-end for verl (platform, gloo, FSDP2 engines on cpu, HF-generate rollout).

Placeholder until the CPU back-end lands: activation is a no-op.
"""


def activate_if_requested() -> None:
    """Register the CPU back-end when asked (never on a GPU machine unless asked)."""
