"""Build a loss dataclass from its name and keyword hyperparameters (the GFlowNet objectives of
``core.gfn.objectives``, the RL baselines of ``core.rl.objectives``), with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def class_by_name(classes: Mapping[str, type[T]], kind: str, name: str) -> type[T]:
    """``classes[name]``; a ValueError naming the ``kind`` and the valid choices otherwise."""
    try:
        return classes[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid choices: {', '.join(classes)}") from None


def hyperparameter_names(classes: Mapping[str, type[Any]], kind: str, name: str) -> tuple[str, ...]:
    """Names of the fields (hyperparameters) of the dataclass ``name``."""
    return tuple(f.name for f in fields(class_by_name(classes, kind, name)))


def build_by_name(
    classes: Mapping[str, type[T]], kind: str, name: str, hyperparameters: Mapping[str, Any]
) -> T:
    """The dataclass ``name`` built with ``hyperparameters``; one it does not take raises a
    ValueError listing the valid ones (values out of range: the class's own ValueError)."""
    cls = class_by_name(classes, kind, name)
    valid = hyperparameter_names(classes, kind, name)
    unknown = sorted(set(hyperparameters) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(
            f"{kind} {name!r} does not take {', '.join(unknown)}; valid hyperparameters: {listed}"
        )
    return cls(**hyperparameters)
