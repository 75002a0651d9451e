"""Model builders and loaders that need no hub access (tiny local model, SmolLM2 from a package)."""
