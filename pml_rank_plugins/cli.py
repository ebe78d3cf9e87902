"""Command line interface (``pml-rank``); filled in by the config/runner work."""
