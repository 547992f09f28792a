"""RP (Hu et al. 2024): reward-prioritised replay, the top items by terminal log-reward.

Per prompt the top ``capacity`` items by terminal log-reward are kept (a ``heapq`` min-heap),
exact duplicates (same token sequence) dropped, and a near-duplicate filter applies: a new
item x is rejected when some stored y has edit(x, y) < tolerance * (|x| + |y|) on tokens (stop
excluded) and R(y) >= R(x). ``force_valid`` exempts valid items from the filter (the reference
code's force-add). Unlike the reference code the filter compares the real token sequences (the
reference compares empty slices and never fires) and the priority is the terminal log-reward
(not the sum of prefix log-rewards).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.item import ReplayItem
from raptb.core.replay.options import BufferOption
from raptb.core.subm.similarity import edit_distances

#: (terminal log-reward, insertion number, item): the unique insertion number breaks ties
#: between equal rewards (older items are evicted first) and keeps heapq from comparing items.
HeapEntry = tuple[float, int, ReplayItem]


class RewardPrioritizedBuffer(ReplayBuffer):
    """RP: top-``capacity`` by terminal log-reward, exact and near-duplicate filtering.

    Each store lists its items in heap order (``heapq`` on (terminal log-reward, insertion
    number)); sampling indexes that list, so the order is part of the state.
    """

    kind = "rp"
    options = (BufferOption.of("capacity"), BufferOption.of("rp_tolerance", "tolerance"))

    def __init__(
        self, capacity: int = 200, tolerance: float = 0.25, force_valid: bool = False
    ) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        self.capacity = int(capacity)
        self.tolerance = float(tolerance)
        self.force_valid = bool(force_valid)
        self._heaps: dict[str, list[HeapEntry]] = {}
        self._counter = 0

    def config(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "tolerance": self.tolerance,
            "force_valid": self.force_valid,
        }

    def _is_near_duplicate(self, item: ReplayItem, store: list[ReplayItem]) -> bool:
        if not store or (self.force_valid and item.valid):
            return False
        dist = edit_distances(item.tokens, [s.tokens for s in store])
        limit = self.tolerance * (item.length + np.array([s.length for s in store]))
        better = np.array([s.terminal_log_r for s in store]) >= item.terminal_log_r
        return bool(np.any((dist < limit) & better))

    def add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        heap = self._heaps.setdefault(prompt, [])
        for item in items:
            # Items admitted earlier in this batch count as stored for both filters.
            store = [entry[2] for entry in heap]
            if any(s.tokens == item.tokens for s in store):
                continue
            if self._is_near_duplicate(item, store):
                continue
            entry = (item.terminal_log_r, self._counter, item)
            if len(heap) >= self.capacity:
                if entry[:2] <= heap[0][:2]:
                    continue
                heapq.heapreplace(heap, entry)
            else:
                heapq.heappush(heap, entry)
            self._counter += 1
        self._stores[prompt] = [entry[2] for entry in heap]

    def _extra_state(self) -> dict[str, Any]:
        return {
            "counter": self._counter,
            "order": [[entry[1] for entry in self._heaps[p]] for p in self._stores],
        }

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self._counter = int(extra["counter"])
        self._heaps = {
            p: [
                (it.terminal_log_r, int(o), it)
                for it, o in zip(self._stores[p], order, strict=True)
            ]
            for p, order in zip(self._stores, extra["order"], strict=True)
        }
        for heap in self._heaps.values():
            if any(heap[(i - 1) // 2][:2] > heap[i][:2] for i in range(1, len(heap))):
                raise ValueError("state heap order is corrupt")
