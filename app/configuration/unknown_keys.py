"""The one line for configuration keys no section declares: every one of them, each with the
declared key closest to it (``core.did_you_mean``) where one is close.

pydantic reports each such key as an ``extra_forbidden`` error at its location (``optim``,
``batchsize``); the line names them all, rather than the first and a count.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

from pydantic import BaseModel, ValidationError

from raptb.core.did_you_mean import close_match


def _section(annotation: object) -> type[BaseModel] | None:
    """The model a field holds (``Options | None`` for a task's section), if it holds one."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _declared(model: type[BaseModel], section: Sequence[str]) -> list[str]:
    """The keys the section at ``section`` (a path of field names from ``model``) declares."""
    current: type[BaseModel] | None = model
    for name in section:
        field = current.model_fields.get(name) if current is not None else None
        current = _section(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


def unknown_keys_line(model: type[BaseModel], exc: ValidationError) -> str | None:
    """``unknown keys optim.batchsize (did you mean optim.batch_size?), ...; ...`` for every
    undeclared key in ``exc`` (raised validating against ``model``), None when there is none.
    Other errors of ``exc`` are counted at the end."""
    described = []
    others = 0
    for error in exc.errors():
        if error["type"] != "extra_forbidden":
            others += 1
            continue
        path = [str(part) for part in error["loc"]]
        match = close_match(path[-1], _declared(model, path[:-1]))
        hint = f" (did you mean {'.'.join([*path[:-1], match])}?)" if match is not None else ""
        described.append(".".join(path) + hint)
    if not described:
        return None
    noun = "key" if len(described) == 1 else "keys"
    more = f" (and {others} other error{'s' if others > 1 else ''})" if others else ""
    return (
        f"unknown {noun} {', '.join(described)}; rename or remove "
        f"{'it' if len(described) == 1 else 'them'} (raptb config prints every key){more}"
    )
