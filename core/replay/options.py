"""The options schema of a buffer kind: which user-facing options it reads, under which names, and
the constructor keywords they set, declared once on the buffer class.

A run's ``[replay]`` section, a task's SubM preset (``TaskSpec.subm``) and the TRL integration's
config all name buffer options by the schema's names (``capacity``, ``subm_weights``,
``bin_weight_power``, ``rp_tolerance``, ...); :func:`buffer_kwargs` turns such a mapping into the
kind's constructor keywords and :func:`check_buffer_options` validates one (unknown names, and
the values, by building the buffer), so the names are translated in one place and in one
direction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BufferOption:
    """One option of a buffer kind.

    name: its name in ``[replay]``, in task presets and in the TRL config.
    arguments: the constructor keyword it sets; several keywords: the value is a sequence
        spread over them in order (SubM's ``subm_weights`` -> w_rew, w_val, w_div, w_len).
    """

    name: str
    arguments: tuple[str, ...]

    @classmethod
    def of(cls, name: str, *arguments: str) -> BufferOption:
        """The option ``name`` setting ``arguments`` (default: the keyword of the same name)."""
        return cls(name, arguments or (name,))

    def kwargs(self, value: Any) -> dict[str, Any]:
        """The constructor keywords ``value`` sets."""
        if len(self.arguments) == 1:
            return {self.arguments[0]: value}
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ValueError(f"{self.name}: must be a list of {len(self.arguments)} values")
        if len(value) != len(self.arguments):
            raise ValueError(
                f"{self.name}: must be a list of {len(self.arguments)} values "
                f"[{', '.join(self.arguments)}], got {len(value)}"
            )
        return dict(zip(self.arguments, value, strict=True))


def buffer_kwargs(
    kind: str, schema: Sequence[BufferOption], options: Mapping[str, Any], *, strict: bool
) -> dict[str, Any]:
    """Constructor keywords of buffer ``kind`` from ``options`` (by option name). A None value
    keeps the buffer's own default. ``strict``: a name the schema does not declare is a
    ValueError listing the kind's options; otherwise such names are ignored (a ``[replay]``
    section holds every kind's options)."""
    declared = {option.name: option for option in schema}
    unknown = sorted(set(options) - set(declared))
    if strict and unknown:
        listed = ", ".join(declared) or "none"
        raise ValueError(
            f"replay {kind!r} does not take {', '.join(unknown)}; its options: {listed}"
        )
    kwargs: dict[str, Any] = {}
    for name, option in declared.items():
        if options.get(name) is not None:
            kwargs.update(option.kwargs(options[name]))
    return kwargs
