"""Build a loss dataclass from its registry, its name and keyword hyperparameters (the GFlowNet
objectives of ``core.gfn.objectives``), with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from raptb.core.registry import Registry

T = TypeVar("T")


def hyperparameter_names(classes: Registry[type[Any]], name: str) -> tuple[str, ...]:
    """Names of the fields (hyperparameters) of the dataclass ``name``."""
    return tuple(f.name for f in fields(classes.lookup(name)))


def build_by_name(classes: Registry[type[T]], name: str, hyperparameters: Mapping[str, Any]) -> T:
    """The dataclass ``name`` built with ``hyperparameters``; one it does not take raises a
    ValueError listing the valid ones (values out of range: the class's own ValueError)."""
    cls = classes.lookup(name)
    valid = hyperparameter_names(classes, name)
    unknown = sorted(set(hyperparameters) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(
            f"{classes.kind} {name!r} does not take {', '.join(unknown)}; valid hyperparameters: "
            f"{listed}"
        )
    return cls(**hyperparameters)
