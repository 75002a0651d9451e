"""Evaluation with the paper's protocol: avg@N on six benchmarks under two decoding settings."""
