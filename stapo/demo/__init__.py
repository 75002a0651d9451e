"""The embedded default: what STAPO does, shown on a real small model on a CPU."""
