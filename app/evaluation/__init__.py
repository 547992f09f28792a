"""Evaluation: ``raptb eval`` (``evaluate``, ``eval_run``, ``eval_sampling``), the exact
evaluation (``exact_eval``), ``raptb enumerate``, the plots and ``raptb bench``."""
