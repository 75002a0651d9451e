"""The verl glue: the only place in the project that imports verl internals."""
