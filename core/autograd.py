"""``stop_gradient`` for the array-API code of the losses: one function for numpy (tests) and torch
(training)."""

from __future__ import annotations

from typing import Any


def stop_gradient(x: Any) -> Any:
    """stopgrad(x): ``x.detach()`` for autograd arrays, identity for numpy."""
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x
