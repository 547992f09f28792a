"""Framework-agnostic core of raptb: batch layout, objectives, replay and metrics.

Nothing in this package imports torch, transformers, rdkit, xgrammar, typer or pydantic;
numerics are written against the array API so that numpy and torch share one implementation.
"""
