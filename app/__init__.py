"""Use cases and the edge: one folder per use case (``configuration``, ``training``,
``evaluation``, ``distribution``, ``run_dir``, ``study``) and, at the root, the command line
(``entry``, ``cli``, ``errors``) and the builders both training and evaluation use (``runtime``)."""
