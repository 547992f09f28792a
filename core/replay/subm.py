"""SubM (the paper): refresh each prompt's store by greedy submodular selection on every add.

On every add, ground set G = stored items + new items, deduplicated by ``item.key`` (the better
terminal log-reward wins), then ``subm_select`` with static score
s(x) = w_rew r(x) + w_val 1[valid(x)], where r(x) is the item's task score S in [0, 1]
(``item.score``; the paper writes r(x) without defining it, the reference code feeds in the task
score, not lambda S, which would tilt the reward/diversity balance lambda-fold) by default.
``reward="u"`` uses the task-only terminal reward u[-1] = lambda S instead, ``"log_r"`` the full
terminal log-reward; S >= 0 keeps f monotone, while log_r includes kappa log P_ref < 0, and items
whose gain is not positive are not kept, so with it the buffer can hold fewer than ``capacity``
items. ``valid`` is the task's replay validity (Expr24: correct), which gating and w_val use.
Similarity is Jaccard on k-gram shingles of the text's characters or words (or of the tokens)
or Tanimoto on ``item.features`` (packed uint64 fingerprints); an item without features is
dissimilar to everything. A ``Similarity`` object (``core.ports``) in place of the name scores the
items' texts (``shingle_on="text"``) or token tuples (``"tokens"``) with its own ``pairwise``.
Only new x all similarities are computed per refresh (``SimilarityCache.quantised``, which keeps
the 2**-15 fixed-point matrix the selection works on). ``diversity="dispersion"`` swaps the
facility term for the reference code's dispersion rule, for comparison runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from raptb.core.ports import Similarity
from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.item import ReplayItem
from raptb.core.replay.options import BufferOption
from raptb.core.subm.select import DIVERSITY, power_bin_alpha, subm_select
from raptb.core.subm.similarity import ShingleJaccardSimilarity, TanimotoSimilarity
from raptb.core.subm.similarity_cache import SimilarityCache

#: SubM's static reward r(x): the task score S, the task-only terminal reward lambda S, or the
#: full terminal log-reward.
REWARDS = ("score", "u", "log_r")
# What Jaccard shingles: the text's characters, its words, or the token ids.
SHINGLE_UNITS = ("text", "words", "tokens")


class SubmodularBuffer(ReplayBuffer):
    """SubM: refresh each prompt's store by greedy submodular selection on every add.

    The store holds the selected items in selection order.
    """

    kind = "subm"
    options = (
        BufferOption.of("capacity"),
        BufferOption.of("subm_method", "method"),
        BufferOption.of("subm_diversity", "diversity"),
        BufferOption.of("bin_weight_power", "length_alpha_power"),
        BufferOption.of("subm_weights", "w_rew", "w_val", "w_div", "w_len"),
        BufferOption.of("gating_ratio"),
        BufferOption.of("length_bin_size"),
        BufferOption.of("similarity"),
        BufferOption.of("shingle_k"),
        BufferOption.of("shingle_on"),
    )

    def __init__(
        self,
        capacity: int = 200,
        *,
        w_rew: float = 1.0,
        w_val: float = 1.0,
        w_div: float = 1.0,
        w_len: float = 1.0,
        gating_ratio: float = 0.0,
        similarity: str | Similarity = "jaccard",
        shingle_k: int = 2,
        shingle_on: str = "text",
        length_bin_size: int = 1,
        length_alpha_power: float | None = None,
        reward: str = "score",
        method: str = "lazy",
        diversity: str = "facility",
    ) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        for name, w in (("w_rew", w_rew), ("w_val", w_val), ("w_div", w_div), ("w_len", w_len)):
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"{name} must be finite and non-negative, got {w}")
        if isinstance(similarity, str):
            if similarity not in ("jaccard", "tanimoto"):
                raise ValueError(f"similarity must be 'jaccard' or 'tanimoto', got {similarity!r}")
        elif not callable(getattr(similarity, "pairwise", None)):
            raise ValueError("similarity must be 'jaccard', 'tanimoto' or a Similarity object")
        if shingle_on not in SHINGLE_UNITS:
            raise ValueError(f"shingle_on must be one of {SHINGLE_UNITS}, got {shingle_on!r}")
        if length_bin_size < 1:
            raise ValueError(f"length_bin_size must be >= 1, got {length_bin_size}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if method not in ("standard", "lazy"):
            raise ValueError(f"method must be 'standard' or 'lazy' (deterministic), got {method!r}")
        if not 0.0 <= gating_ratio <= 1.0:
            raise ValueError(f"gating_ratio must be in [0, 1], got {gating_ratio}")
        if diversity not in DIVERSITY:
            raise ValueError(f"diversity must be one of {DIVERSITY}, got {diversity!r}")
        self.capacity = int(capacity)
        self.w_rew, self.w_val, self.w_div, self.w_len = map(float, (w_rew, w_val, w_div, w_len))
        self.gating_ratio = float(gating_ratio)
        self.similarity = similarity
        self.shingle_k = int(shingle_k)
        self.shingle_on = shingle_on
        self.length_bin_size = int(length_bin_size)
        self.length_alpha_power = length_alpha_power
        self.reward = reward
        self.method = method
        self.diversity = diversity
        self._caches: dict[str, SimilarityCache] = {}
        self.last_refresh_size = 0

    def config(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "w_rew": self.w_rew,
            "w_val": self.w_val,
            "w_div": self.w_div,
            "w_len": self.w_len,
            "gating_ratio": self.gating_ratio,
            "similarity": (
                self.similarity
                if isinstance(self.similarity, str)
                else type(self.similarity).__qualname__
            ),
            "shingle_k": self.shingle_k,
            "shingle_on": self.shingle_on,
            "length_bin_size": self.length_bin_size,
            "length_alpha_power": self.length_alpha_power,
            "reward": self.reward,
            "method": self.method,
            "diversity": self.diversity,
        }

    def similarity_backend(self) -> object:
        """The kernel of the facility-location term: the given ``Similarity`` object, or the
        named backend built from ``similarity``, ``shingle_k`` and ``shingle_on`` (evaluation's
        Vendi score scores samples with it too)."""
        if not isinstance(self.similarity, str):
            return self.similarity
        if self.similarity == "tanimoto":
            return TanimotoSimilarity()
        return ShingleJaccardSimilarity(self.shingle_k, words=self.shingle_on == "words")

    def _feature(self, item: ReplayItem, n_words: int) -> object:
        if self.similarity != "tanimoto":
            return item.tokens if self.shingle_on == "tokens" else item.text
        if item.features is None:
            return np.zeros(n_words, dtype=np.uint64)
        if item.features.dtype != np.uint64 or item.features.size != n_words:
            raise ValueError(
                f"features must be uint64 fingerprints of {n_words} words, got "
                f"{item.features.dtype} of {item.features.size}"
            )
        return item.features

    def _reward(self, item: ReplayItem) -> float:
        if self.reward == "log_r":
            return item.terminal_log_r
        if self.reward == "u":
            return item.terminal_u
        if item.score is None:
            raise ValueError(
                f"SubM's static reward is the task score, and item {item.text!r} has none "
                "(restored from an older checkpoint); reward='u' uses lambda S instead"
            )
        return item.score

    def _static(self, items: Sequence[ReplayItem]) -> np.ndarray:
        r = np.array([self._reward(it) for it in items])
        if not np.all(np.isfinite(r)):
            raise ValueError(f"terminal {self.reward} must be finite for SubM's static score")
        return self.w_rew * r + self.w_val * np.array([it.valid for it in items], dtype=float)

    def add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        ground: dict[str, ReplayItem] = {it.key: it for it in self._stores.get(prompt, [])}
        for it in items:
            old = ground.get(it.key)
            if old is None or it.terminal_log_r > old.terminal_log_r:
                ground[it.key] = it
        cand = list(ground.values())
        self.last_refresh_size = len(cand)
        n_words = max((it.features.size for it in cand if it.features is not None), default=32)
        cache = self._caches.setdefault(prompt, SimilarityCache(self.similarity_backend()))
        # Same key means same features (text, canonical molecule); tokens disambiguate when
        # shingling tokens, where equal texts may come from different token sequences.
        keys = [(it.key, it.tokens) for it in cand]
        # Fixed point, symmetric by construction: no per-refresh rounding or symmetry pass.
        sim = cache.quantised(keys, [self._feature(it, n_words) for it in cand])
        bins = np.array([it.length // self.length_bin_size for it in cand], dtype=np.int64)
        alpha = None
        if self.length_alpha_power is not None:
            alpha = power_bin_alpha(int(bins.max()) + 1, self.length_alpha_power)
        picked = subm_select(
            sim,
            self._static(cand),
            bins,
            self.capacity,
            w_div=self.w_div,
            w_len=self.w_len,
            bin_alpha=alpha,
            valid=np.array([it.valid for it in cand], dtype=bool),
            gating_ratio=self.gating_ratio,
            method=self.method,
            diversity=self.diversity,
        )
        self._stores[prompt] = [cand[i] for i in picked]
        cache.retain([keys[i] for i in picked])  # |B|^2 entries between refreshes, not |G|^2

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        del extra
        self._caches = {}
