"""A loss's own defaults: what its objective class declares, under the file and the flags.

The ``[objective]`` and ``[rl]`` sections write their defaults once, from raptb's own objective
classes (RapTB's for ``[objective]``, GRPO's and PPO's for ``[rl]``), and every field of a section
has a value. A loss whose class declares another default for a field the section holds (a plug-in
``GRPO`` subclass with ``epsilon = 0.05``, a RapTB subclass with ``eta = 0.5``, a new objective
with a field of its own name) would be trained with the section's value instead, silently. Its
own defaults are therefore merged into the configuration under the file and the flags, as its
``presets`` are: a field's default counts as the class's own when no class of raptb it derives
from declares the same default for it. raptb's built-in losses change nothing by this (their
sections' defaults are theirs), and ``config.toml`` records the values the loss is built with.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from raptb.app.configuration.losses import Loss


def _shipped(cls: type) -> bool:
    return cls.__module__.startswith("raptb.")


def _inherited(cls: type, name: str) -> Any:
    """The default of field ``name`` in the nearest class of raptb ``cls`` derives from (MISSING
    when none declares it)."""
    for base in cls.__mro__[1:]:
        if _shipped(base) and name in getattr(base, "__dataclass_fields__", {}):
            return base.__dataclass_fields__[name].default
    return MISSING


def own_defaults(loss: Loss, section_fields: set[str]) -> dict[str, Any]:
    """``{section: {field: default}}``: the defaults ``loss``'s objective class declares itself
    for fields of its config section (``section_fields``); empty for raptb's own classes."""
    cls = loss.objective
    if _shipped(cls):
        return {}
    own: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in section_fields or f.default is MISSING:
            continue
        if f.default == _inherited(cls, f.name):
            continue
        value = f.default
        if f.name == "k_min" and isinstance(value, int):
            value = (value, value)  # [objective] k_min is a (start, end) schedule
        own[f.name] = value
    return {loss.section: own} if own else {}
