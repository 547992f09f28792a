"""``make_buffer``: build a replay buffer by kind name, from the registry of buffer kinds.

A buffer kind is a :class:`ReplayBuffer` subclass with a class-level ``kind`` (the ``[replay]
kind`` value) and a ``config_kwargs`` classmethod (which ``[replay]`` options it reads);
:func:`register_buffer` adds one, an installed package's ``raptb.buffers`` entry point adds one
when the registry is first read (core.plugins), and ``BUFFERS`` is what configuration
validation, ``make_buffer`` and the run's buffer read.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any

from raptb.core.plugins import check_class, load_group_once
from raptb.core.registry import Registry
from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.options import buffer_kwargs
from raptb.core.replay.oracle import OracleBuffer
from raptb.core.replay.prt import PrioritizedReplayTraining
from raptb.core.replay.rp import RewardPrioritizedBuffer
from raptb.core.replay.subm import SubmodularBuffer

BUFFER_GROUP = "raptb.buffers"
"""The entry-point group of replay buffers from installed packages (core.plugins)."""


def _register_buffer_plugin(point: EntryPoint, cls: Any) -> None:
    check_class(point, cls, ReplayBuffer, "raptb.ReplayBuffer", key="kind")
    BUFFERS.register(cls)


def _load_buffer_plugins() -> None:
    load_group_once(BUFFER_GROUP, _register_buffer_plugin)


_SHIPPED = (RewardPrioritizedBuffer, PrioritizedReplayTraining, SubmodularBuffer, OracleBuffer)
BUFFERS: Registry[type[ReplayBuffer]] = Registry(
    "replay kind",
    lambda cls: getattr(cls, "kind", None),
    _SHIPPED,
    reserved=("none",),
    load=_load_buffer_plugins,
)
# not read from BUFFERS: that would load the plug-ins while raptb is still being imported
BUFFER_KINDS = tuple(cls.kind for cls in _SHIPPED)
"""The shipped kinds, in the order the docs list them."""
NO_REPLAY = "none"
"""The ``[replay] kind`` of a run without a buffer."""


def replay_kinds() -> tuple[str, ...]:
    """Every valid ``[replay] kind``: ``none``, then the registered kinds."""
    return (NO_REPLAY, *BUFFERS)


def register_buffer(cls: type[ReplayBuffer]) -> type[ReplayBuffer]:
    """Add buffer kind ``cls`` to ``BUFFERS`` (usable as a class decorator); a kind may be
    registered once (ValueError otherwise)."""
    return BUFFERS.register(cls)


def buffer_class(kind: str) -> type[ReplayBuffer]:
    """The registered class of ``kind``; a ValueError lists the kinds otherwise."""
    return BUFFERS.lookup(kind)


def option_default(kind: str, option: str) -> Any:
    """The default of buffer ``kind``'s option ``option`` (by its schema name): the default of
    the constructor keyword it sets, or the list of them for an option that sets several
    (``subm_weights``). The one source of the buffers' defaults: ``[replay]`` and the TRL config
    read theirs here."""
    # a shipped kind is found without reading the plug-ins (the config classes call this while
    # raptb is still being imported)
    cls = {shipped.kind: shipped for shipped in _SHIPPED}.get(kind) or buffer_class(kind)
    declared = {o.name: o for o in cls.options}
    if option not in declared:
        raise ValueError(f"replay {kind!r} has no option {option!r}")
    parameters = inspect.signature(cls.__init__).parameters
    defaults = [parameters[argument].default for argument in declared[option].arguments]
    return defaults[0] if len(defaults) == 1 else defaults


def replay_kwargs(kind: str, options: Mapping[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """Validate ``options`` (by option name: ``[replay]``'s, a task's SubM preset, the TRL
    config's) against the options schema of buffer ``kind`` and return its constructor keywords:
    a value the buffer refuses is a one-line ValueError, and so is a name the kind does not
    declare when ``strict`` (without, such names are ignored: a config holding every kind's
    options, as the TRL config does, passes them all). None values keep the buffer's defaults."""
    cls = buffer_class(kind)
    if cls.oracle and strict and options:
        raise ValueError(f"replay {kind!r} takes no options; its items come from the task")
    kwargs = buffer_kwargs(kind, cls.options, options, strict=strict)
    if not cls.oracle:
        cls(**kwargs)  # the buffer's own checks of the values (cheap: an empty buffer)
    return kwargs


def make_buffer(kind: str, **kwargs: Any) -> ReplayBuffer:
    """Build a buffer of ``kind`` with the keyword arguments of its class (e.g. ``capacity``).

    A task's SubM preset (weights, similarity) comes from its spec in the task registry of the
    adapters; ``oracle`` takes ``items``.
    """
    return buffer_class(kind)(**kwargs)
