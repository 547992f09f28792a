"""Adapters binding the core to concrete technologies (torch/transformers, xgrammar, rdkit, tasks)."""
