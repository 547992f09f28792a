"""Incremental similarity matrix of a replay store's ground set (``SimilarityCache``).

A replay refresh sees the previous ground set plus a few new items. The cache keeps the matrix
of the previous call keyed by item key, so a refresh only computes the new-by-all block
(O(n_new * n) kernel calls instead of O(n^2)) through any ``Similarity`` port backend, in float32
or directly on SubM's 2**-15 fixed-point grid (``core.subm.fixed_point``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numba as nb
import numpy as np

from raptb.core.subm.fixed_point import QuantisedSimilarity, quantise_rows, require_symmetric

#: Most float32 similarities ``SimilarityCache.quantised`` asks a backend for at once (64 MiB).
_BLOCK_ELEMENTS = 1 << 24


@nb.njit(cache=True)
def _gather_block(old: np.ndarray, src: np.ndarray, dst: np.ndarray, out: np.ndarray) -> None:
    for i in range(src.shape[0]):
        row_old = old[src[i]]
        row_out = out[dst[i]]
        for j in range(src.shape[0]):
            row_out[dst[j]] = row_old[src[j]]


@nb.njit(cache=True)
def _assemble_fixed(
    old: np.ndarray,
    old_of: np.ndarray,
    blockq: np.ndarray,
    block_sums: np.ndarray,
    new_of: np.ndarray,
    out: np.ndarray,
    rowsum: np.ndarray,
) -> None:
    """out[p] = blockq[new_of[p]] for a new item p; for a kept item, the old row gathered on the
    kept columns and the new columns read from the block (symmetric mirror). Row sums on the
    way (new rows: the block's)."""
    n = out.shape[0]
    n_kept = 0
    for p in range(n):
        n_kept += old_of[p] >= 0
    kept = np.empty(n_kept, dtype=np.int64)
    news = np.empty(n - n_kept, dtype=np.int64)
    a = 0
    b = 0
    for p in range(n):
        if old_of[p] >= 0:
            kept[a] = p
            a += 1
        else:
            news[b] = p
            b += 1
    for p in range(n):
        row = out[p]
        if new_of[p] >= 0:
            row[:] = blockq[new_of[p]]
            rowsum[p] = block_sums[new_of[p]]
            continue
        src = old[old_of[p]]
        total = 0
        for t in range(kept.shape[0]):
            j = kept[t]
            v = src[old_of[j]]
            row[j] = v
            total += v
        for t in range(news.shape[0]):
            j = news[t]
            v = blockq[new_of[j], p]
            row[j] = v
            total += v
        rowsum[p] = total


class SimilarityCache:
    """Similarity matrix of the current ground set, recomputing only pairs involving new keys.

    ``matrix(keys, features)`` returns the float32 [n, n] matrix ``sim(features[i], features[j])``;
    ``quantised(keys, features)`` the same similarity as a ``QuantisedSimilarity`` (uint16 on the
    2**-15 grid, what ``subm_select`` works on; the SubM buffer uses this form). Rows/columns of
    keys seen in the previous call are copied; only the block new x all is computed
    (``pairs_computed`` counts kernel evaluations, for tests and benchmarks) and mirrored, so
    the matrix is symmetric whenever the new x new block is: backends that declare
    ``symmetric = True`` (Tanimoto and shingle Jaccard, whose formulas are symmetric in exact
    arithmetic and in floating point) are trusted, other backends have that block checked.
    Keys must be unique and must identify the features: an item whose features change needs a
    new key. Switching between the two forms recomputes everything once.
    """

    def __init__(self, similarity: object) -> None:
        if not hasattr(similarity, "pairwise"):
            raise ValueError("similarity must implement pairwise(a, b) (the Similarity port)")
        self.similarity = similarity
        self.pairs_computed = 0
        self.clear()

    def clear(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self._fixed = np.zeros((0, 0), dtype=np.uint16)  # the uint16 grid values
        self._form = "float"

    def _plan(
        self, keys: Sequence[Hashable], features: Sequence[object], form: str
    ) -> tuple[dict[Hashable, int], list[int], list[int], list[int]]:
        if len(keys) != len(features):
            raise ValueError(f"keys ({len(keys)}) and features ({len(features)}) differ in length")
        index = {key: i for i, key in enumerate(keys)}
        if len(index) != len(keys):
            raise ValueError("keys must be unique")
        if form != self._form:
            self.clear()
            self._form = form
        kept_pos = [i for i, key in enumerate(keys) if key in self._index]
        old_pos = [self._index[keys[i]] for i in kept_pos]
        new_pos = [i for i, key in enumerate(keys) if key not in self._index]
        return index, kept_pos, old_pos, new_pos

    def _block(self, features: Sequence[object], new_pos: list[int]) -> np.ndarray:
        block = np.asarray(
            self.similarity.pairwise([features[i] for i in new_pos], list(features)),  # type: ignore[attr-defined]
            dtype=np.float32,
        )
        if block.shape != (len(new_pos), len(features)):
            raise ValueError(
                f"pairwise returned shape {block.shape}, expected {(len(new_pos), len(features))}"
            )
        self.pairs_computed += block.size
        return block

    def retain(self, keys: Sequence[Hashable]) -> None:
        """Keep only these cached keys (in this order), e.g. the items a refresh selected, so
        that the cache holds |kept|^2 entries between refreshes instead of the ground set's."""
        missing = [k for k in keys if k not in self._index]
        if missing:
            raise ValueError(f"retain: {len(missing)} keys are not cached, e.g. {missing[0]!r}")
        pos = np.array([self._index[k] for k in keys], dtype=np.int64)
        if self._form == "float":
            self._matrix = np.ascontiguousarray(self._matrix[np.ix_(pos, pos)])
        else:
            self._fixed = np.ascontiguousarray(self._fixed[np.ix_(pos, pos)])
        self._index = {key: i for i, key in enumerate(keys)}

    def matrix(self, keys: Sequence[Hashable], features: Sequence[object]) -> np.ndarray:
        index, kept_pos, old_pos, new_pos = self._plan(keys, features, "float")
        n = len(keys)
        out = np.empty((n, n), dtype=np.float32)
        if kept_pos:
            _gather_block(
                self._matrix,
                np.array(old_pos, dtype=np.int64),
                np.array(kept_pos, dtype=np.int64),
                out,
            )
        if new_pos:
            block = self._block(features, new_pos)
            out[new_pos, :] = block
            out[:, new_pos] = block.T
        self._index = index
        self._matrix = out
        return out

    def quantised(
        self, keys: Sequence[Hashable], features: Sequence[object]
    ) -> QuantisedSimilarity:
        index, kept_pos, old_pos, new_pos = self._plan(keys, features, "fixed")
        n = len(keys)
        old_of = np.full(n, -1, dtype=np.int64)
        old_of[kept_pos] = old_pos
        new_of = np.full(n, -1, dtype=np.int64)
        new_of[new_pos] = np.arange(len(new_pos))
        if new_pos:
            # Row chunks keep the float32 kernel output at <= 64 MiB whatever the ground set.
            blockq = np.empty((len(new_pos), n), dtype=np.uint16)
            block_sums = np.empty(len(new_pos), dtype=np.int64)
            step = max(1, _BLOCK_ELEMENTS // max(n, 1))
            for c0 in range(0, len(new_pos), step):
                part = new_pos[c0 : c0 + step]
                blockq[c0 : c0 + len(part)], block_sums[c0 : c0 + len(part)] = quantise_rows(
                    self._block(features, part)
                )
            if not getattr(self.similarity, "symmetric", False):
                require_symmetric(
                    np.ascontiguousarray(blockq[:, new_pos]),
                    f"{type(self.similarity).__name__}.pairwise on the new items",
                )
        else:
            blockq = np.zeros((0, n), dtype=np.uint16)
            block_sums = np.zeros(0, dtype=np.int64)
        out = np.empty((n, n), dtype=np.uint16)
        rowsum = np.empty(n, dtype=np.int64)
        _assemble_fixed(self._fixed, old_of, blockq, block_sums, new_of, out, rowsum)
        self._index = index
        self._fixed = out
        return QuantisedSimilarity(out, rowsum, check=False)
