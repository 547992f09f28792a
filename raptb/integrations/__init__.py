"""Bindings of raptb's objectives and replay buffers to other training frameworks.

An edge like ``raptb.app``: it may import ``raptb.core`` and ``raptb.adapters``; nothing in core,
adapters or app imports it. Each framework is a subpackage that needs its own extra
(``raptb.integrations.trl``: ``pip install 'raptb[trl]'``).
"""
