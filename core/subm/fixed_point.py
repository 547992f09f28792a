"""The fixed-point similarity SubM works on: values k / 2**15 held as uint16.

Every greedy method, and ``subm_value``, works on a uint16 copy of the similarity rounded to the
grid k / 2**15 (``quantise_similarity``, round half up), so **selection is on the quantised
similarity**: two items whose float gains differ by less than about |P| * 2**-16 may be ordered
differently than on the float input. Grid values are exact in float32/float64, so inputs
already on the grid are used as they are. Facility gains are then exact integers (int32 SIMD
partial sums of at most ``CHUNK`` terms), identical whatever the loop or summation order; the
uint16 rows also halve the memory traffic of float32 (8 KiB per row at |G| = 4096).

Memory: a float input costs the float32 [|P|, |P|] matrix plus the uint16 copy (1 GiB + 0.5 GiB
at |G| = 16384); a ``QuantisedSimilarity`` input (what the SubM buffer passes, kept up to date by
``SimilarityCache.quantised``) only its uint16 matrix (0.5 GiB at 16384). No float64 n x n
anywhere.
"""

from __future__ import annotations

import numba as nb
import numpy as np

#: Fixed-point scale: similarities are rounded to the grid k / 2**15, k in [0, 2**15], held as
#: uint16. Grid values are exact in float32 and float64, so quantising them again is the
#: identity and f(S) on grid inputs equals the float64 definition up to summation rounding.
SCALE = 32768
#: Largest |q[i, j] - q[j, i]| (in grid steps) still accepted as symmetric.
SYMMETRY_STEPS = 1
#: int32 partial sums of at most this many terms of <= 2**15 cannot overflow.
CHUNK = 32768


@nb.njit(cache=True)
def _quantise_into(sim: np.ndarray, q: np.ndarray, rowsum: np.ndarray) -> int:
    """q = floor(sim * SCALE + 1/2) (round half up) row by row, vectorised; rowsum[i] = sum of
    q[i] (the facility gain of item i against the empty set, fused here to save a pass).

    Returns the count of values outside [0, 1] (NaN included); q is then garbage and the caller
    raises."""
    n = sim.shape[0]
    good = 0
    scale = np.float32(SCALE)
    for i in range(n):
        total = 0
        for c0 in range(0, sim.shape[1], CHUNK):
            row = sim[i, c0 : c0 + CHUNK]
            out = q[i, c0 : c0 + CHUNK]
            g = np.int32(0)
            acc = np.int32(0)
            for j in range(row.shape[0]):
                s = row[j]
                # NaN fails both comparisons, so it is counted too.
                g += np.int32(s >= np.float32(0.0)) & np.int32(s <= np.float32(1.0))
                v = np.int32(s * scale + np.float32(0.5))
                out[j] = np.uint16(v)
                acc += v
            good += g
            total += acc
        rowsum[i] = total
    return n * sim.shape[1] - good


@nb.njit(cache=True)
def max_asymmetry(q: np.ndarray) -> int:
    """max |q[i, j] - q[j, i]| in grid steps, over bands of 8 rows (8 uint16 lines of one column
    block stay in one L1 set; wider bands thrash it on power-of-two row strides)."""
    n = q.shape[0]
    band = 8
    worst = 0
    for i0 in range(0, n, band):
        i1 = min(i0 + band, n)
        for j in range(i0 + 1, n):
            row_j = q[j]
            w = np.int32(0)
            for i in range(i0, min(i1, j)):
                w = max(w, abs(np.int32(row_j[i]) - np.int32(q[i, j])))
            worst = max(worst, w)
    return worst


@nb.njit(cache=True)
def _max_and_row_sums(q: np.ndarray, rowsum: np.ndarray) -> int:
    """Largest value of a uint16 matrix; rowsum[i] = sum of row i (int32 SIMD partial sums)."""
    worst = 0
    for i in range(q.shape[0]):
        total = 0
        for c0 in range(0, q.shape[1], CHUNK):
            row = q[i, c0 : c0 + CHUNK]
            acc = np.int32(0)
            top = np.uint16(0)
            for j in range(row.shape[0]):
                acc += np.int32(row[j])
                top = max(top, row[j])
            total += acc
            worst = max(worst, np.int64(top))
        rowsum[i] = total
    return worst


def require_symmetric(q: np.ndarray, subject: str) -> None:
    """Raise unless the square uint16 grid matrix q is symmetric within SYMMETRY_STEPS."""
    asym = max_asymmetry(q) if q.size else 0
    if asym > SYMMETRY_STEPS:
        raise ValueError(
            f"{subject} is not symmetric: max |S - S^T| = {asym / SCALE:.3g} on the 2**-15 "
            f"grid, at most {SYMMETRY_STEPS} grid step allowed"
        )


class QuantisedSimilarity:
    """A symmetric similarity already on the 2**-15 grid: what every greedy loop works on.

    ``values`` is a C-contiguous uint16 [n, n] matrix (value k means similarity k / 2**15) and
    ``row_sums`` its int64 row sums (the facility gains against the empty set). Passing one to
    ``subm_select`` or ``subm_value`` skips the float -> grid rounding and the all-pairs
    symmetry check, which at |G| = 4096 cost about twice the lazy selection itself
    (~8 + ~18 ms against ~12 ms on a 2-core EPYC; benchmarks/subm.md).

    Build one with ``from_float`` (rounds and checks a float matrix), with the constructor
    (checks range and symmetry of a uint16 matrix unless ``check=False``), or let
    ``SimilarityCache.quantised`` maintain one incrementally across refreshes (symmetric by
    construction, no n x n float matrix at all: 2 bytes per pair, 512 MiB at |G| = 16384).
    """

    __slots__ = ("row_sums", "values")

    def __init__(
        self, values: np.ndarray, row_sums: np.ndarray | None = None, *, check: bool = True
    ) -> None:
        q = np.asarray(values)
        if q.ndim != 2 or q.shape[0] != q.shape[1]:
            raise ValueError(f"values must be a square [n, n] matrix, got shape {q.shape}")
        if q.dtype != np.uint16:
            raise ValueError(f"values must be uint16 grid values, got dtype {q.dtype}")
        q = np.ascontiguousarray(q)
        if check or row_sums is None:
            sums = np.zeros(q.shape[0], dtype=np.int64)
            top = _max_and_row_sums(q, sums) if q.size else 0
            if check and top > SCALE:
                raise ValueError(f"values must be at most 2**15 (similarity 1), got {top}")
            if check:
                require_symmetric(q, "similarity")
            if row_sums is not None and not np.array_equal(np.asarray(row_sums), sums):
                raise ValueError("row_sums do not match the row sums of values")
            row_sums = sums
        rs = np.asarray(row_sums)
        if rs.shape != (q.shape[0],) or not np.issubdtype(rs.dtype, np.integer):
            raise ValueError(f"row_sums must be an integer array of shape [{q.shape[0]}]")
        self.values = q
        self.row_sums = rs.astype(np.int64, copy=False)

    @classmethod
    def from_float(
        cls, similarity: np.ndarray, *, check_symmetry: bool = True
    ) -> QuantisedSimilarity:
        """Round a float [n, n] matrix with values in [0, 1] to the grid (NaN and range always
        checked, symmetry when ``check_symmetry``)."""
        sim = np.asarray(similarity)
        if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
            raise ValueError(f"similarity must be a square [n, n] matrix, got shape {sim.shape}")
        if not np.issubdtype(sim.dtype, np.floating):
            raise ValueError(f"similarity must be a float array, got dtype {sim.dtype}")
        q, rowsum = quantise_rows(sim)
        if check_symmetry:
            require_symmetric(q, "similarity")
        return cls(q, rowsum, check=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.values.shape[0]

    def to_float(self) -> np.ndarray:
        """The similarity as float32 (exact: grid values are float32 numbers)."""
        return self.values.astype(np.float32) * np.float32(1.0 / SCALE)


def quantise_similarity(similarity: np.ndarray) -> np.ndarray:
    """uint16 fixed-point copy round(sim * 2**15) of a float matrix with values in [0, 1].

    This is the similarity every method, and ``subm_value``, works on. Raises on NaN or values
    outside [0, 1]. No symmetry check (see ``subm_select``).
    """
    return quantise_rows(similarity)[0]


def quantise_rows(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round any 2-D float array with values in [0, 1] to the 2**-15 grid: (uint16 copy, int64
    row sums of the copy). Raises on NaN or values outside [0, 1]; see ``quantise_similarity``."""
    sim = np.ascontiguousarray(similarity, dtype=np.float32)
    if sim.ndim != 2:
        raise ValueError(f"similarity must be 2-D, got shape {sim.shape}")
    # numpy (not Numba) allocates: large numpy buffers get transparent huge pages where the
    # kernel offers them, which makes the first touch of 32 MiB about 5x cheaper.
    q = np.empty(sim.shape, dtype=np.uint16)
    rowsum = np.zeros(sim.shape[0], dtype=np.int64)
    if sim.size and _quantise_into(sim, q, rowsum):
        if not np.all(np.isfinite(sim)):
            raise ValueError("similarity contains NaN or infinite values")
        raise ValueError("similarity values must lie in [0, 1]")
    return q, rowsum
