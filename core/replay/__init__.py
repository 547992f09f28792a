"""Replay buffers for LLM-GFlowNet training: RP, PRT, SubM and Oracle, kept per prompt.

Every buffer stores ``ReplayItem``s (a generated trajectory with its per-prefix log-rewards
log_r[k] = log R(s_{0:k} + stop), k = 0..len, and task-only rewards u[k]) in one store per
prompt, and shares one interface (``ReplayBuffer``).

Modules, one concept each:

- ``item``: ``ReplayItem`` and its array serialisation for checkpoints.
- ``base``: ``ReplayBuffer``, the shared interface and per-prompt bookkeeping.
- ``rp``: RP (Hu et al. 2024), the top items by terminal log-reward with duplicate filters.
- ``prt``: PRT (Shen et al. 2023), RP storage with two-tier sampling.
- ``subm``: SubM (the paper), greedy submodular selection on every add.
- ``oracle``: uniform draws from a given solution set.
- ``options``: a kind's options schema (``BufferOption``), read by ``[replay]``, task presets and
  the TRL config.
- ``factory``: the registry of kinds, ``make_buffer`` by kind name, ``replay_kwargs`` (options
  validated against the kind's schema).
"""

from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.factory import (
    BUFFER_KINDS,
    BUFFERS,
    NO_REPLAY,
    buffer_class,
    make_buffer,
    option_default,
    register_buffer,
    replay_kinds,
    replay_kwargs,
)
from raptb.core.replay.item import ReplayItem
from raptb.core.replay.options import BufferOption
from raptb.core.replay.oracle import OracleBuffer
from raptb.core.replay.prt import PrioritizedReplayTraining
from raptb.core.replay.rp import RewardPrioritizedBuffer
from raptb.core.replay.subm import SubmodularBuffer

__all__ = [
    "BUFFERS",
    "BUFFER_KINDS",
    "NO_REPLAY",
    "BufferOption",
    "OracleBuffer",
    "PrioritizedReplayTraining",
    "ReplayBuffer",
    "ReplayItem",
    "RewardPrioritizedBuffer",
    "SubmodularBuffer",
    "buffer_class",
    "make_buffer",
    "option_default",
    "register_buffer",
    "replay_kinds",
    "replay_kwargs",
]
