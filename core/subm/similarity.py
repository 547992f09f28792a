"""Similarity kernels for SubM's facility-location term.

Two backends, both returning float32 matrices with values in [0, 1]:

- Tanimoto on packed bit fingerprints. A fingerprint of ``n_bits`` bits is stored as
  ``ceil(n_bits / 64)`` uint64 words (bit i in word i // 64, position i % 64). For fingerprints
  a, b with popcounts |a|, |b|:

      T(a, b) = |a & b| / (|a| + |b| - |a & b|),   T(0, 0) = 0

  (the zero-by-zero convention is RDKit's ``BulkTanimotoSimilarity``; it also makes an item with
  no fingerprint, e.g. an invalid molecule, dissimilar to everything). Popcount is the LLVM
  ``ctpop`` intrinsic, so it compiles to the CPU's popcount instruction.
- Jaccard on k-gram shingle sets of strings (characters) or token sequences (token ids):

      J(A, B) = |A & B| / |A | B|,   J({}, {}) = 0

  A sequence shorter than k contributes itself as its single shingle. Shingles are hashed to
  64-bit integers (FNV-1a over the code points / token ids plus a splitmix64 finaliser, so
  stable across processes) and kept as sorted unique int64 arrays (memoised per sequence, since
  buffer items recur every refresh); intersections are linear merges in Numba. Two distinct
  shingles collide with probability about 2^-64. With ``words=True`` a string shingles over its
  words instead (lower-cased runs of letters and digits, inner apostrophes kept; each word hashed
  like a character k-gram), so k = 1 is the word-unigram Jaccard of CommonGen's SubM column.

``core.subm.similarity_cache`` keeps these matrices up to date across replay refreshes. Token edit
distance (Levenshtein on integer sequences) for RP's near-duplicate filter lives here too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

_MASK64 = (1 << 64) - 1
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


@intrinsic
def _popcount64(typingctx, x):  # type: ignore[no-untyped-def]
    """LLVM ``ctpop`` on a uint64 (Numba has no portable popcount of its own)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.ctpop(args[0])

    return sig, codegen


@nb.njit(cache=True)
def _row_popcounts(fps: np.ndarray) -> np.ndarray:
    out = np.empty(fps.shape[0], dtype=np.int64)
    for i in range(fps.shape[0]):
        c = 0
        for w in range(fps.shape[1]):
            c += _popcount64(fps[i, w])
        out[i] = c
    return out


@nb.njit(cache=True)
def _tanimoto_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nw = a.shape
    nbr = b.shape[0]
    ca = _row_popcounts(a)
    cb = _row_popcounts(b)
    out = np.empty((na, nbr), dtype=np.float32)
    # Serial on purpose: on a small shared machine thread wake-ups cost more than the
    # 32 x 232 block of a paper-setting refresh.
    for i in range(na):
        for j in range(nbr):
            inter = 0
            for w in range(nw):
                inter += _popcount64(a[i, w] & b[j, w])
            union = ca[i] + cb[j] - inter
            out[i, j] = np.float32(inter / union) if union > 0 else np.float32(0.0)
    return out


def _as_fingerprints(fps: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(fps)
    if arr.ndim != 2 or arr.dtype != np.uint64:
        raise ValueError(
            f"{name} must be a 2-D uint64 array [n, words], got {arr.dtype} {arr.shape}"
        )
    return np.ascontiguousarray(arr)


def tanimoto_matrix(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Tanimoto similarity of packed fingerprints: ``a`` [n, w], ``b`` [m, w] uint64 -> [n, m] f32.

    ``b`` defaults to ``a``. Equals RDKit's ``BulkTanimotoSimilarity`` row by row.
    """
    a = _as_fingerprints(a, "a")
    b = a if b is None else _as_fingerprints(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"a and b must have the same word count, got {a.shape[1]} and {b.shape[1]}"
        )
    return _tanimoto_kernel(a, b)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack a boolean matrix [n, n_bits] into uint64 words [n, ceil(n_bits / 64)].

    Bit i of a row lands in word i // 64 at position i % 64 (little-endian bit order), which is
    the layout ``tanimoto_matrix`` expects.
    """
    arr = np.asarray(bits)
    if arr.ndim != 2:
        raise ValueError(f"bits must be 2-D [n, n_bits], got shape {arr.shape}")
    n, n_bits = arr.shape
    n_words = -(-n_bits // 64)
    padded = np.zeros((n, n_words * 64), dtype=bool)
    padded[:, :n_bits] = arr.astype(bool)
    packed = np.packbits(padded, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64, copy=False)


@nb.njit(cache=True)
def _gram_hashes(symbols: np.ndarray, k: int) -> np.ndarray:
    """The hash of each k-gram of the uint64 ``symbols`` (the whole of a sequence shorter than k):
    FNV-1a over whole symbols, then a splitmix64 finaliser so nearby grams spread over 64 bits
    (uint64 arithmetic, wrapping); as int64, sorted and unique."""
    n = symbols.shape[0]
    width = min(n, k)
    out = np.empty(n - width + 1, dtype=np.uint64)
    for g in range(out.shape[0]):
        h = np.uint64(0xCBF29CE484222325)
        for s in range(g, g + width):
            h = (h ^ symbols[s]) * np.uint64(0x100000001B3)
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out[g] = h ^ (h >> np.uint64(31))
    return np.unique(out.view(np.int64))


def _symbols(seq: str | Sequence[int]) -> np.ndarray:
    """A string's code points, or a sequence's integers mod 2^64, as uint64."""
    if isinstance(seq, str):
        points = seq.encode("utf-32-le", "surrogatepass")
        return np.frombuffer(points, dtype="<u4").astype(np.uint64)
    try:
        return np.array(seq, dtype=np.uint64).reshape(-1)
    except OverflowError:  # a negative integer: its two's complement, as & _MASK64 takes it
        return np.array([int(t) & _MASK64 for t in seq], dtype=np.uint64)


def shingle_ids(seq: str | Sequence[int], k: int = 2) -> np.ndarray:
    """Sorted unique int64 hashes of the k-gram shingles of a string or token-id sequence.

    Strings shingle over characters, sequences over their integer elements. An empty sequence
    has no shingles; one shorter than k is a single shingle. The hashes are ``_gram_hashes``'s, a
    compiled loop (the main job's SubM refresh shingles its new items' texts every step).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    symbols = _symbols(seq)
    if symbols.size == 0:
        return np.empty(0, dtype=np.int64)
    return _gram_hashes(symbols, k)


def word_symbols(text: str) -> list[int]:
    """The words of ``text`` (lower-cased letter/digit runs) as stable 64-bit hashes, in order:
    each word's characters hashed as one gram (``_gram_hashes``), unsigned."""
    words = _WORD.findall(text.lower())
    return [int(_gram_hashes(_symbols(word), len(word))[0]) & _MASK64 for word in words]


def word_shingle_ids(text: str, k: int = 1) -> np.ndarray:
    """Sorted unique int64 hashes of the word k-grams of ``text`` (``shingle_ids`` over words)."""
    return shingle_ids(word_symbols(text), k)


def _to_csr(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sets])
    values = np.concatenate(sets).astype(np.int64) if sets else np.empty(0, dtype=np.int64)
    return values, offsets


@nb.njit(cache=True)
def _jaccard_kernel(
    a_vals: np.ndarray, a_off: np.ndarray, b_vals: np.ndarray, b_off: np.ndarray
) -> np.ndarray:
    na = a_off.shape[0] - 1
    nbr = b_off.shape[0] - 1
    out = np.empty((na, nbr), dtype=np.float32)
    for i in range(na):
        i0, i1 = a_off[i], a_off[i + 1]
        for j in range(nbr):
            j0, j1 = b_off[j], b_off[j + 1]
            p, q, inter = i0, j0, 0
            while p < i1 and q < j1:  # a merge without branches (a step: 3-4 cycles)
                x, y = a_vals[p], b_vals[q]
                inter += x == y
                p += x <= y
                q += y <= x
            union = (i1 - i0) + (j1 - j0) - inter
            out[i, j] = np.float32(inter / union) if union > 0 else np.float32(0.0)
    return out


def jaccard_matrix(a: Sequence[np.ndarray], b: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """Jaccard similarity of shingle sets given as sorted unique int64 arrays -> [len(a), len(b)].

    Use ``shingle_ids`` to build the sets; ``b`` defaults to ``a``.
    """
    a_vals, a_off = _to_csr(a)
    b_vals, b_off = (a_vals, a_off) if b is None else _to_csr(b)
    return _jaccard_kernel(a_vals, a_off, b_vals, b_off)


class TanimotoSimilarity:
    """``Similarity`` port over packed uint64 fingerprints (one 1-D word array per item)."""

    #: pairwise(a, b)[i, j] == pairwise(b, a)[j, i] exactly (see ``SimilarityCache``).
    symmetric = True

    def pairwise(self, a: Sequence[object], b: Sequence[object]) -> np.ndarray:
        if len(a) == 0 or len(b) == 0:
            return np.zeros((len(a), len(b)), dtype=np.float32)
        return tanimoto_matrix(np.stack(a), np.stack(b))  # type: ignore[arg-type]


class ShingleJaccardSimilarity:
    """``Similarity`` port over strings or token sequences: Jaccard of k-gram shingle sets.

    words: shingle strings over their words (``word_shingle_ids``) instead of their characters.
    Shingle sets are memoised by sequence (at most ``memo_size`` entries, then the memo restarts).
    """

    #: pairwise(a, b)[i, j] == pairwise(b, a)[j, i] exactly (see ``SimilarityCache``).
    symmetric = True

    def __init__(self, k: int = 2, memo_size: int = 65536, *, words: bool = False) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.words = words
        self.memo_size = memo_size
        self._memo: dict[str | tuple[int, ...], np.ndarray] = {}

    def shingles(self, seq: str | Sequence[int]) -> np.ndarray:
        key = seq if isinstance(seq, str) else tuple(int(t) for t in seq)
        ids = self._memo.get(key)
        if ids is None:
            if len(self._memo) >= self.memo_size:
                self._memo = {}
            ids = self._memo[key] = (
                word_shingle_ids(key, self.k)
                if self.words and isinstance(key, str)
                else shingle_ids(key, self.k)
            )
        return ids

    def pairwise(self, a: Sequence[object], b: Sequence[object]) -> np.ndarray:
        if len(a) == 0 or len(b) == 0:
            return np.zeros((len(a), len(b)), dtype=np.float32)
        sa = [self.shingles(x) for x in a]  # type: ignore[arg-type]
        sb = sa if a is b else [self.shingles(x) for x in b]  # type: ignore[arg-type]
        return jaccard_matrix(sa, sb)


@nb.njit(cache=True)
def _levenshtein(a: np.ndarray, b: np.ndarray) -> int:
    n, m = a.shape[0], b.shape[0]
    prev = np.arange(m + 1)
    cur = np.empty(m + 1, dtype=prev.dtype)
    for i in range(1, n + 1):
        cur[0] = i
        ai = a[i - 1]
        for j in range(1, m + 1):
            cost = 0 if ai == b[j - 1] else 1
            best = prev[j - 1] + cost
            if prev[j] + 1 < best:
                best = prev[j] + 1
            if cur[j - 1] + 1 < best:
                best = cur[j - 1] + 1
            cur[j] = best
        prev, cur = cur, prev
    return prev[m]


@nb.njit(cache=True)
def _levenshtein_to_many(query: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    out = np.empty(offsets.shape[0] - 1, dtype=np.int64)
    for j in range(out.shape[0]):
        out[j] = _levenshtein(query, values[offsets[j] : offsets[j + 1]])
    return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token-id sequences (unit insert/delete/substitute)."""
    return int(_levenshtein(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)))


def edit_distances(query: Sequence[int], others: Sequence[Sequence[int]]) -> np.ndarray:
    """Levenshtein distance from ``query`` to each sequence in ``others`` -> int64 [len(others)]."""
    if not others:
        return np.empty(0, dtype=np.int64)
    values, offsets = _to_csr([np.asarray(o, dtype=np.int64) for o in others])
    return _levenshtein_to_many(np.asarray(query, dtype=np.int64), values, offsets)
