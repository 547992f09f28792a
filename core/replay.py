"""Replay buffers for LLM-GFlowNet training: RP, PRT, SubM and Oracle, kept per prompt.

Every buffer stores ``ReplayItem``s (a generated trajectory with its per-prefix log-rewards
log_r[k] = log R(s_{0:k} + stop), k = 0..len, and task-only rewards u[k]) in one store per prompt,
and shares one interface: ``add(items)``, ``sample(n, rng, prompt=None)`` (uniform with
replacement unless stated), ``len()``, ``state_dict()`` / ``load_state_dict()`` (numpy arrays and
JSON-able values only, so a checkpoint restores sampling exactly).

- RP (Hu et al. 2024): per prompt the top ``capacity`` items by terminal log-reward (min-heap),
  exact duplicates (same token sequence) dropped, and a near-duplicate filter: a new item x is
  rejected when some stored y has edit(x, y) < tolerance * (|x| + |y|) on tokens (stop excluded)
  and R(y) >= R(x). ``force_valid`` exempts valid items from the filter (the reference code's
  force-add). Unlike the reference code the filter compares the real token sequences (the
  reference compares empty slices and never fires) and the priority is the terminal log-reward
  (not the sum of prefix log-rewards).
- PRT (Shen et al. 2023): RP storage; a fraction alpha of each sample comes uniformly from the top
  ceil(beta |B|) items by terminal log-reward, the rest uniformly from the remainder. The top
  count is floor(alpha n) plus one with probability frac(alpha n), so its mean is alpha n.
- SubM (the paper): on every add, ground set G = stored items + new items, deduplicated by
  ``item.key`` (the better terminal log-reward wins), then ``subm_select`` with static score
  s(x) = w_rew r(x) + w_val 1[valid(x)], where r(x) is the task-only terminal reward u[-1] by
  default (the paper writes r(x) without defining it; the reference code feeds in the task
  score). The task-only reward is >= 0 for the paper's tasks, which keeps f monotone; the full
  log-reward (``reward="log_r"``) includes kappa log P_ref < 0, and items whose gain is not
  positive are not kept, so with it the buffer can hold fewer than ``capacity`` items. Similarity
  is Jaccard on k-gram shingles of the text (or tokens) or Tanimoto on ``item.features`` (packed
  uint64 fingerprints); an item without features is dissimilar to everything. Only new x all
  similarities are computed per refresh (``SimilarityCache.quantised``, which keeps the
  2**-15 fixed-point matrix the selection works on). ``diversity="dispersion"`` swaps the
  facility term for the reference code's dispersion rule, for comparison runs.
- Oracle: uniform draws from a given solution set (Expr24's enumerated answers).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from raptb.core.similarity import (
    ShingleJaccardSimilarity,
    SimilarityCache,
    TanimotoSimilarity,
    edit_distances,
)
from raptb.core.subm import DIVERSITY, power_bin_alpha, subm_select


@dataclass(frozen=True, eq=False)
class ReplayItem:
    """One generated trajectory for a prompt.

    prompt: the conditioning text (buffers are kept per prompt).
    tokens: generated token ids, stop token excluded; length L = len(tokens).
    text: the decoded generated text.
    log_r: float64 [L + 1], log_r[k] = log-reward of the prefix of k tokens followed by stop.
    u: float64 [L + 1], task-only reward per prefix.
    valid: whether the terminal text is feasible.
    features: optional 1-D array for the similarity backend (e.g. a packed uint64 fingerprint).
    canonical: optional canonical form for SubM's dedup (e.g. canonical SMILES); defaults to text.
    """

    prompt: str
    tokens: tuple[int, ...]
    text: str
    log_r: np.ndarray
    u: np.ndarray
    valid: bool
    features: np.ndarray | None = None
    canonical: str | None = field(default=None)

    def __post_init__(self) -> None:
        tokens = tuple(int(t) for t in self.tokens)
        object.__setattr__(self, "tokens", tokens)
        shape = (len(tokens) + 1,)
        for name in ("log_r", "u"):
            arr = np.array(getattr(self, name), dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(
                    f"{name} must have shape {shape} (len(tokens) + 1), got {arr.shape}"
                )
            if np.isnan(arr).any():
                raise ValueError(f"{name} contains NaN")
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        if self.features is not None:
            feats = np.array(self.features)
            if feats.ndim != 1:
                raise ValueError(f"features must be 1-D, got shape {feats.shape}")
            feats.flags.writeable = False
            object.__setattr__(self, "features", feats)
        object.__setattr__(self, "valid", bool(self.valid))

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def terminal_log_r(self) -> float:
        return float(self.log_r[-1])

    @property
    def terminal_u(self) -> float:
        return float(self.u[-1])

    @property
    def key(self) -> str:
        """Canonical identity for SubM's dedup: ``canonical`` if given, else the text."""
        return self.text if self.canonical is None else self.canonical


def _pack_items(items: Sequence[ReplayItem]) -> dict[str, Any]:
    """Flatten items into arrays (ragged fields as values + offsets) and JSON-able lists."""
    lengths = np.array([it.length for it in items], dtype=np.int64)
    has_feat = np.array([it.features is not None for it in items], dtype=bool)
    feats = [it.features for it in items if it.features is not None]
    feat_dtype = str(feats[0].dtype) if feats else "uint64"
    return {
        "prompts": [it.prompt for it in items],
        "texts": [it.text for it in items],
        "canonical": [it.canonical for it in items],
        "lengths": lengths,
        "tokens": np.array([t for it in items for t in it.tokens], dtype=np.int64),
        "log_r": np.concatenate([it.log_r for it in items]) if items else np.zeros(0),
        "u": np.concatenate([it.u for it in items]) if items else np.zeros(0),
        "valid": np.array([it.valid for it in items], dtype=bool),
        "has_features": has_feat,
        "feature_lengths": np.array([f.size for f in feats], dtype=np.int64),
        "features": np.concatenate(feats) if feats else np.zeros(0, dtype=feat_dtype),
        "feature_dtype": feat_dtype,
    }


def _unpack_items(d: dict[str, Any]) -> list[ReplayItem]:
    lengths = np.asarray(d["lengths"], dtype=np.int64)
    tok_off = np.concatenate([[0], np.cumsum(lengths)])
    r_off = np.concatenate([[0], np.cumsum(lengths + 1)])
    feat_off = np.concatenate([[0], np.cumsum(np.asarray(d["feature_lengths"], dtype=np.int64))])
    feats = np.asarray(d["features"]).astype(d["feature_dtype"], copy=False)
    tokens = np.asarray(d["tokens"], dtype=np.int64)
    log_r = np.asarray(d["log_r"], dtype=np.float64)
    u = np.asarray(d["u"], dtype=np.float64)
    out = []
    f = 0
    for i in range(lengths.size):
        feature = None
        if bool(d["has_features"][i]):
            feature = feats[feat_off[f] : feat_off[f + 1]]
            f += 1
        out.append(
            ReplayItem(
                prompt=d["prompts"][i],
                tokens=tuple(tokens[tok_off[i] : tok_off[i + 1]].tolist()),
                text=d["texts"][i],
                log_r=log_r[r_off[i] : r_off[i + 1]],
                u=u[r_off[i] : r_off[i + 1]],
                valid=bool(d["valid"][i]),
                features=feature,
                canonical=d["canonical"][i],
            )
        )
    return out


class ReplayBuffer(ABC):
    """Shared interface and per-prompt bookkeeping of all buffers."""

    kind: ClassVar[str]

    def __init__(self) -> None:
        self._stores: dict[str, list[ReplayItem]] = {}

    def add(self, items: Sequence[ReplayItem]) -> None:
        """Route ``items`` to their prompt's store (in order) and update it."""
        by_prompt: dict[str, list[ReplayItem]] = {}
        for it in items:
            if not isinstance(it, ReplayItem):
                raise ValueError(f"items must be ReplayItem instances, got {type(it).__name__}")
            by_prompt.setdefault(it.prompt, []).append(it)
        for prompt, group in by_prompt.items():
            self._add_to_prompt(prompt, group)

    @abstractmethod
    def _add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None: ...

    def _store(self, prompt: str | None) -> list[ReplayItem]:
        if prompt is None:
            if len(self._stores) != 1:
                raise ValueError(
                    f"prompt is required when the buffer holds {len(self._stores)} prompts"
                )
            prompt = next(iter(self._stores))
        store = self._stores.get(prompt)
        if not store:
            raise ValueError(f"no items stored for prompt {prompt!r}")
        return store

    def sample(
        self, n: int, rng: np.random.Generator, prompt: str | None = None
    ) -> list[ReplayItem]:
        """``n`` items drawn uniformly with replacement from ``prompt``'s store."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        store = self._store(prompt)
        return [store[i] for i in rng.integers(0, len(store), size=n)]

    def items(self, prompt: str | None = None) -> list[ReplayItem]:
        """The stored items of ``prompt`` in storage order (a copy)."""
        return list(self._store(prompt))

    def prompts(self) -> list[str]:
        return [p for p, s in self._stores.items() if s]

    def __len__(self) -> int:
        return sum(len(s) for s in self._stores.values())

    def config(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        prompts = list(self._stores)
        return {
            "kind": self.kind,
            "config": self.config(),
            "prompts": prompts,
            "stores": [_pack_items(self._stores[p]) for p in prompts],
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"state kind is {state.get('kind')!r}, this buffer is {self.kind!r}")
        if state.get("config") != self.config():
            raise ValueError(
                f"state config {state.get('config')} differs from this buffer's {self.config()}"
            )
        self._stores = {
            p: _unpack_items(d) for p, d in zip(state["prompts"], state["stores"], strict=True)
        }
        self._load_extra_state(state.get("extra", {}))

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        del extra


class RewardPrioritizedBuffer(ReplayBuffer):
    """RP: top-``capacity`` by terminal log-reward, exact and near-duplicate filtering.

    Each store is a min-heap list of items ordered by (terminal log-reward, insertion number);
    sampling indexes that list, so its order is part of the state.
    """

    kind = "rp"

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
        self._heaps: dict[str, list[tuple[float, int]]] = {}
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

    def _add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        store = self._stores.setdefault(prompt, [])
        heap = self._heaps.setdefault(prompt, [])
        for item in items:
            if any(s.tokens == item.tokens for s in store):
                continue
            if self._is_near_duplicate(item, store):
                continue
            entry = (item.terminal_log_r, self._counter)
            if len(store) >= self.capacity:
                if entry <= heap[0]:
                    continue
                self._replace_min(store, heap, entry, item)
            else:
                self._push(store, heap, entry, item)
            self._counter += 1

    @staticmethod
    def _push(
        store: list[ReplayItem],
        heap: list[tuple[float, int]],
        entry: tuple[float, int],
        item: ReplayItem,
    ) -> None:
        # Heap entries carry the insertion number; the store list mirrors the heap order.
        heap.append(entry)
        store.append(item)
        i = len(heap) - 1
        while i > 0:
            parent = (i - 1) // 2
            if heap[parent] <= heap[i]:
                break
            heap[i], heap[parent] = heap[parent], heap[i]
            store[i], store[parent] = store[parent], store[i]
            i = parent

    @staticmethod
    def _replace_min(
        store: list[ReplayItem],
        heap: list[tuple[float, int]],
        entry: tuple[float, int],
        item: ReplayItem,
    ) -> None:
        heap[0] = entry
        store[0] = item
        i, n = 0, len(heap)
        while True:
            small = i
            for c in (2 * i + 1, 2 * i + 2):
                if c < n and heap[c] < heap[small]:
                    small = c
            if small == i:
                return
            heap[i], heap[small] = heap[small], heap[i]
            store[i], store[small] = store[small], store[i]
            i = small

    def _extra_state(self) -> dict[str, Any]:
        return {
            "counter": self._counter,
            "order": [[h[1] for h in self._heaps[p]] for p in self._stores],
        }

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self._counter = int(extra["counter"])
        self._heaps = {
            p: [(it.terminal_log_r, int(o)) for it, o in zip(self._stores[p], order, strict=True)]
            for p, order in zip(self._stores, extra["order"], strict=True)
        }
        for heap in self._heaps.values():
            if any(heap[(i - 1) // 2] > heap[i] for i in range(1, len(heap))):
                raise ValueError("state heap order is corrupt")


class PrioritizedReplayTraining(RewardPrioritizedBuffer):
    """PRT: RP storage with two-tier sampling (alpha from the top ceil(beta |B|), rest below)."""

    kind = "prt"

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


class SubmodularBuffer(ReplayBuffer):
    """SubM: refresh each prompt's store by greedy submodular selection on every add.

    The store holds the selected items in selection order.
    """

    kind = "subm"

    def __init__(
        self,
        capacity: int = 200,
        *,
        w_rew: float = 1.0,
        w_val: float = 1.0,
        w_div: float = 1.0,
        w_len: float = 1.0,
        gating_ratio: float = 0.0,
        similarity: str = "jaccard",
        shingle_k: int = 2,
        shingle_on: str = "text",
        length_bin_size: int = 1,
        length_alpha_power: float | None = None,
        reward: str = "u",
        method: str = "lazy",
        diversity: str = "facility",
    ) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        for name, w in (("w_rew", w_rew), ("w_val", w_val), ("w_div", w_div), ("w_len", w_len)):
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"{name} must be finite and non-negative, got {w}")
        if similarity not in ("jaccard", "tanimoto"):
            raise ValueError(f"similarity must be 'jaccard' or 'tanimoto', got {similarity!r}")
        if shingle_on not in ("text", "tokens"):
            raise ValueError(f"shingle_on must be 'text' or 'tokens', got {shingle_on!r}")
        if length_bin_size < 1:
            raise ValueError(f"length_bin_size must be >= 1, got {length_bin_size}")
        if reward not in ("log_r", "u"):
            raise ValueError(f"reward must be 'log_r' or 'u', got {reward!r}")
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
            "similarity": self.similarity,
            "shingle_k": self.shingle_k,
            "shingle_on": self.shingle_on,
            "length_bin_size": self.length_bin_size,
            "length_alpha_power": self.length_alpha_power,
            "reward": self.reward,
            "method": self.method,
            "diversity": self.diversity,
        }

    def _backend(self) -> object:
        if self.similarity == "tanimoto":
            return TanimotoSimilarity()
        return ShingleJaccardSimilarity(self.shingle_k)

    def _feature(self, item: ReplayItem, n_words: int) -> object:
        if self.similarity == "jaccard":
            return item.text if self.shingle_on == "text" else item.tokens
        if item.features is None:
            return np.zeros(n_words, dtype=np.uint64)
        if item.features.dtype != np.uint64 or item.features.size != n_words:
            raise ValueError(
                f"features must be uint64 fingerprints of {n_words} words, got "
                f"{item.features.dtype} of {item.features.size}"
            )
        return item.features

    def _static(self, items: Sequence[ReplayItem]) -> np.ndarray:
        r = np.array(
            [it.terminal_log_r if self.reward == "log_r" else it.terminal_u for it in items]
        )
        if not np.all(np.isfinite(r)):
            raise ValueError(f"terminal {self.reward} must be finite for SubM's static score")
        return self.w_rew * r + self.w_val * np.array([it.valid for it in items], dtype=float)

    def _add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        ground: dict[str, ReplayItem] = {it.key: it for it in self._stores.get(prompt, [])}
        for it in items:
            old = ground.get(it.key)
            if old is None or it.terminal_log_r > old.terminal_log_r:
                ground[it.key] = it
        cand = list(ground.values())
        self.last_refresh_size = len(cand)
        n_words = max((it.features.size for it in cand if it.features is not None), default=32)
        cache = self._caches.setdefault(prompt, SimilarityCache(self._backend()))
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


class OracleBuffer(ReplayBuffer):
    """Oracle: uniform draws from a given solution set (``add`` extends it, exact dups dropped)."""

    kind = "oracle"

    def __init__(self, items: Sequence[ReplayItem] = ()) -> None:
        super().__init__()
        self.add(items)

    def _add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        store = self._stores.setdefault(prompt, [])
        seen = {it.tokens for it in store}
        for it in items:
            if it.tokens not in seen:
                seen.add(it.tokens)
                store.append(it)


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
