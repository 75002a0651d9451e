"""`stapo sweep`: grids of runs x seeds and their comparison (mean +- standard error over seeds)."""
