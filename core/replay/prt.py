"""PRT (Shen et al. 2023): RP storage with two-tier sampling.

A fraction alpha of each sample comes uniformly from the top ceil(beta |B|) items by terminal
log-reward, the rest uniformly from the remainder. The top count is floor(alpha n) plus one with
probability frac(alpha n), so its mean is alpha n.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from raptb.core.replay.item import ReplayItem
from raptb.core.replay.options import BufferOption
from raptb.core.replay.rp import RewardPrioritizedBuffer


class PrioritizedReplayTraining(RewardPrioritizedBuffer):
    """PRT: RP storage with two-tier sampling (alpha from the top ceil(beta |B|), rest below)."""

    kind = "prt"
    options = (
        *RewardPrioritizedBuffer.options,
        BufferOption.of("prt_alpha", "alpha"),
        BufferOption.of("prt_beta", "beta"),
    )

    def __init__(
        self,
        capacity: int = 200,
        tolerance: float = 0.25,
        force_valid: bool = False,
        alpha: float = 0.7,
        beta: float = 0.2,
    ) -> None:
        super().__init__(capacity, tolerance, force_valid)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1], got {beta}")
        self.alpha = float(alpha)
        self.beta = float(beta)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "alpha": self.alpha, "beta": self.beta}

    def tiers(self, prompt: str | None = None) -> tuple[list[ReplayItem], list[ReplayItem]]:
        """(top ceil(beta |B|) items by terminal log-reward, the rest); ties: older first."""
        store = self._store(prompt)
        heap = self._heaps[prompt if prompt is not None else next(iter(self._stores))]
        order = sorted(range(len(store)), key=lambda i: (-heap[i][0], heap[i][1]))
        n_top = math.ceil(self.beta * len(store))
        return [store[i] for i in order[:n_top]], [store[i] for i in order[n_top:]]

    def sample(
        self, n: int, rng: np.random.Generator, prompt: str | None = None
    ) -> list[ReplayItem]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        top, rest = self.tiers(prompt)
        if not rest:
            return [top[i] for i in rng.integers(0, len(top), size=n)]
        want = self.alpha * n
        n_top = math.floor(want) + int(rng.random() < want - math.floor(want))
        picks = [top[i] for i in rng.integers(0, len(top), size=n_top)]
        picks += [rest[i] for i in rng.integers(0, len(rest), size=n - n_top)]
        return [picks[i] for i in rng.permutation(n)]
