"""Defaults of ``raptb eval`` that the command line shows and the evaluation uses.

Its own light module, so that ``app.evaluation.eval_command`` states them without importing the
evaluation (torch, the model).
"""

from __future__ import annotations

DEFAULT_BATCH_SIZE = 256
"""Rows sampled in lock step per chunk (a different size gives another, equally valid, draw)."""
