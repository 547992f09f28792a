"""``make_buffer``: build a replay buffer by kind name, from the registry of buffer kinds.

A buffer kind is a :class:`ReplayBuffer` subclass with a class-level ``kind`` (the ``[replay]
kind`` value) and a ``config_kwargs`` classmethod (which ``[replay]`` options it reads);
:func:`register_buffer` adds one, and ``BUFFERS`` is what configuration validation,
``make_buffer`` and the run's buffer read.
"""

from __future__ import annotations

from typing import Any

from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.oracle import OracleBuffer
from raptb.core.replay.prt import PrioritizedReplayTraining
from raptb.core.replay.rp import RewardPrioritizedBuffer
from raptb.core.replay.subm import SubmodularBuffer

BUFFERS: dict[str, type[ReplayBuffer]] = {
    cls.kind: cls
    for cls in (RewardPrioritizedBuffer, PrioritizedReplayTraining, SubmodularBuffer, OracleBuffer)
}
BUFFER_KINDS = tuple(BUFFERS)
"""The shipped kinds, in the order the docs list them."""


def register_buffer(cls: type[ReplayBuffer]) -> type[ReplayBuffer]:
    """Add buffer kind ``cls`` to ``BUFFERS`` (usable as a class decorator); a kind may be
    registered once (ValueError otherwise)."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind.isidentifier() or kind == "none":
        raise ValueError(f"a buffer needs a class attribute kind (an identifier), got {kind!r}")
    known = BUFFERS.get(kind)
    if known is not None and known is not cls:
        raise ValueError(f"replay kind {kind!r} is already registered")
    BUFFERS[kind] = cls
    return cls


def buffer_class(kind: str) -> type[ReplayBuffer]:
    """The registered class of ``kind``; a ValueError lists the kinds otherwise."""
    try:
        return BUFFERS[kind]
    except KeyError:
        raise ValueError(f"kind must be one of {tuple(BUFFERS)}, got {kind!r}") from None


def make_buffer(kind: str, **kwargs: Any) -> ReplayBuffer:
    """Build a buffer of ``kind`` with the keyword arguments of its class (e.g. ``capacity``).

    A task's SubM preset (weights, similarity) comes from its spec in the task registry of the
    adapters; ``oracle`` takes ``items``.
    """
    return buffer_class(kind)(**kwargs)
