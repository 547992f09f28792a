"""The error that stops a run which cannot go on (raptb exits with 2 and names the cause)."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite losses)."""
