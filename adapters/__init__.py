"""Adapters binding the core to concrete technologies (torch, xgrammar, rdkit, tasks)."""
