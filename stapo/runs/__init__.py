"""The run library: start a recipe process and follow it (``process``, ``progress``, ``train``), read a
run folder back (``folder``), compare and plot groups of runs (``compare``, ``plot``: ``stapo plot``).
``stapo demo``, ``stapo sweep``, ``stapo doctor`` and the tests all run and read recipes through it;
it imports none of them."""
