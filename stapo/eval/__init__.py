"""Evaluation with the paper's protocol: avg@N on six benchmarks under two decoding settings, or on a user's own
test file scored by the user's reward (own.py)."""
