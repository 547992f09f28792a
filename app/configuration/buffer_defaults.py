"""A replay buffer's own defaults and options: what its class declares, under presets and flags.

The ``[replay]`` section holds the options of every buffer kind, each with SubM's, RP's or PRT's
default, and a kind reads only those its options schema declares (``ReplayBuffer.options``,
core.replay.options). A plug-in buffer whose constructor defaults ``capacity`` to 50 would be
built with the section's 200, and one that declares no options would drop ``--replay.capacity
1000`` while ``config.toml`` recorded 1000. So, as a loss's own defaults are
(app.configuration.loss_defaults):

- the kind's constructor defaults of the options it declares are merged into the configuration
  under the presets, the file and the flags (:func:`own_defaults`); raptb's own kinds change
  nothing by this, except that SubM's options no task preset sets are recorded with the values
  SubM is built with;
- an option the file or a flag sets that the kind does not declare is refused, in one line
  (:func:`check_chosen`), not dropped;
- ``config.toml`` records the part of the behaviour mix and the options the kind reads, nothing
  else (:func:`recorded`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from raptb.core.replay import BUFFERS, NO_REPLAY, buffer_class, option_default

MIX_OPTIONS = ("kind", "p_replay", "p_oracle", "oracle_fraction")
"""``[replay]`` fields that are the run's behaviour mix, read by the loop whatever the kind."""


def _plain(value: Any) -> bool:
    """Whether ``value`` can stand in a TOML file (a Similarity object, say, cannot)."""
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


def declared(kind: str) -> tuple[str, ...]:
    """The ``[replay]`` options buffer ``kind`` reads (none for ``none`` or an unknown kind)."""
    if kind == NO_REPLAY or kind not in BUFFERS:
        return ()
    return tuple(option.name for option in buffer_class(kind).options)


def own_defaults(kind: Any, section_fields: Iterable[str]) -> dict[str, Any]:
    """``{"replay": {option: default}}``: the constructor defaults of the options buffer ``kind``
    declares that the ``[replay]`` section holds (``section_fields``); empty for ``none``, an
    unknown kind (validation reports it) or one built from the task (Oracle)."""
    if not isinstance(kind, str) or not declared(kind) or buffer_class(kind).oracle:
        return {}
    own: dict[str, Any] = {}
    for name in declared(kind):
        default = option_default(kind, name)
        values = default if isinstance(default, list) else [default]
        if name in section_fields and inspect.Parameter.empty not in values and _plain(default):
            own[name] = default
    return {"replay": own} if own else {}


def check_chosen(kind: Any, chosen: Iterable[str], section_fields: Iterable[str]) -> None:
    """A ValueError (one line, ``invalid config: ...``) when options the file or the flags set
    (``chosen``, ``[replay]`` names) are not read by buffer ``kind``."""
    if not isinstance(kind, str) or (kind != NO_REPLAY and kind not in BUFFERS):
        return  # validation names the kinds
    unread = [
        name
        for name in chosen
        if name in section_fields and name not in MIX_OPTIONS and name not in declared(kind)
    ]
    if not unread:
        return
    them = "it" if len(unread) == 1 else "them"
    names = ", ".join(f"replay.{name}" for name in sorted(unread))
    listed = ", ".join(declared(kind)) or "none"
    raise ValueError(
        f"invalid config: {names}: replay kind {kind!r} does not take {them} (its options: "
        f"{listed}); remove {them} from the file and the flags, or choose a kind that takes {them}"
    )


def mix_read(kind: str) -> tuple[str, ...]:
    """The behaviour mix's fields a run of buffer ``kind`` reads: ``p_replay`` where there is a
    buffer, ``p_oracle`` and ``oracle_fraction`` where it is built from the task's oracle."""
    if kind == NO_REPLAY:
        return ("kind",)
    oracle = kind in BUFFERS and buffer_class(kind).oracle
    return MIX_OPTIONS if oracle else ("kind", "p_replay")


def recorded(replay: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[replay]`` values a run records (``replay``: the section's values by name): the
    behaviour mix its kind reads and the options its kind reads."""
    keep = {*mix_read(replay["kind"]), *declared(replay["kind"])}
    return {name: value for name, value in replay.items() if name in keep}
