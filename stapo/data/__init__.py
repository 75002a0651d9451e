"""Data preparation: verl parquet converters, synthetic tasks."""
