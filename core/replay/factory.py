"""``make_buffer``: build a replay buffer by kind name."""

from __future__ import annotations

from typing import Any

from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.oracle import OracleBuffer
from raptb.core.replay.prt import PrioritizedReplayTraining
from raptb.core.replay.rp import RewardPrioritizedBuffer
from raptb.core.replay.subm import SubmodularBuffer

BUFFER_KINDS = ("rp", "prt", "subm", "oracle")


def make_buffer(kind: str, **kwargs: Any) -> ReplayBuffer:
    """Build a buffer of ``kind`` with the keyword arguments of its class (e.g. ``capacity``).

    A task's SubM preset (weights, similarity) comes from its spec in the task registry of the
    adapters; ``oracle`` takes ``items``.
    """
    if kind == "rp":
        return RewardPrioritizedBuffer(**kwargs)
    if kind == "prt":
        return PrioritizedReplayTraining(**kwargs)
    if kind == "subm":
        return SubmodularBuffer(**kwargs)
    if kind == "oracle":
        return OracleBuffer(**kwargs)
    raise ValueError(f"kind must be one of {BUFFER_KINDS}, got {kind!r}")
