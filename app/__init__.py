"""Use cases and the edge: configuration, training loop, evaluation, reporting and the CLI."""
