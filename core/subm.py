"""SubM: greedy maximisation of the paper's submodular replay objective (Numba kernels).

Ground set G of n items, similarity sim(v, x) in [0, 1] (symmetric), static score s(x), length
bin b(x) >= 0 with weights alpha_b >= 0. For S subset of the gated pool P (see below):

    f(S) = sum_{x in S} s(x) + w_div sum_{v in P} msim(v, S) + w_len sum_b alpha_b log(1 + c_b(S))

    msim(v, S) = max_{x in S} sim(v, x),  msim(v, {}) = 0,  c_b(S) = |{x in S : b(x) = b}|

and the marginal gain the greedy loops evaluate is

    Delta(x | S) = s(x) + w_div sum_{v in P} max(0, sim(v, x) - msim(v, S))
                   + w_len alpha_{b(x)} log((2 + c_{b(x)}) / (1 + c_{b(x)})).

With s >= 0 and non-negative weights f is monotone submodular, so greedy is within (1 - 1/e) of
the optimum (Nemhauser, Wolsey, Fisher 1978). Selection stops at ``budget`` items or as soon as no
candidate has a positive gain (negative static scores therefore exclude items).

Validity gating (ratio rho in [0, 1], paper "Validity gating for diversity"): the pool P keeps
every valid item and the invalid items with the highest static score (ties: lower index) up to
the largest count that keeps valid / |P| >= rho. P is both the candidate set and the ground set
of the facility term (as in the paper's code; with rho = 1 invalid items are never selected).
rho = 0 keeps everything.

Methods: ``standard`` (argmax over all candidates every step), ``lazy`` (Minoux 1978: a max-heap of
stale gains; by submodularity a stale gain bounds the current one, and because IEEE rounding is
monotone the bound also holds in floating point, so lazy returns the same selection as standard
with ties broken identically, lowest index first) and ``stochastic`` (Mirzasoleiman et al. 2015:
each step scans a random sample of ceil(n / budget * log(1 / epsilon)) remaining candidates).

``diversity="dispersion"`` swaps the facility term for the released reference code's rule,
w_div (1 - max_{s in S} sim(x, s)), for comparison runs (see ``subm_select``).

Precision (fixed point): every method, and ``subm_value``, works on a uint16 copy of the
similarity rounded to the grid k / 2**15 (``quantise_similarity``), so **selection is on the
quantised similarity**: two items whose float gains differ by less than about |P| * 2**-16 may
be ordered differently than on the float input. Grid values are exact in float32/float64, so
inputs already on the grid are used as they are. Facility gains are then exact integers (int32
SIMD partial sums), identical whatever the loop or summation order, and the full gain is one
float64 formula of that integer, so standard and lazy see bit-identical gains; the uint16 rows
also halve the memory traffic of float32 (8 KiB per row at |G| = 4096).

Memory: a float input costs the float32 [|P|, |P|] matrix plus the uint16 copy (1 GiB + 0.5 GiB
at |G| = 16384); a ``QuantisedSimilarity`` input (what the SubM buffer passes, kept up to date by
``SimilarityCache.quantised``) only its uint16 matrix (0.5 GiB at 16384). No float64 n x n
anywhere.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

METHODS = ("standard", "lazy", "stochastic")
DIVERSITY = ("facility", "dispersion")


#: Fixed-point scale: similarities are rounded to the grid k / 2**15, k in [0, 2**15], held as
#: uint16. Grid values are exact in float32 and float64, so quantising them again is the
#: identity and f(S) on grid inputs equals the float64 definition up to summation rounding.
SCALE = 32768
#: Largest |q[i, j] - q[j, i]| (in grid steps) still accepted as symmetric.
SYMMETRY_STEPS = 1
_CHUNK = 32768  # int32 partial sums of at most this many terms of <= 2**15 cannot overflow
#: Smallest pool for which lazy re-evaluates four stale heap tops per pass (rows of >= 4 KiB come
#: from DRAM and four concurrent row streams hide latency; smaller matrices sit in cache, where
#: the extra re-evaluations only cost). Read at call time, so tests can lower it.
LAZY_BATCH_MIN_N = 2048


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
        for c0 in range(0, sim.shape[1], _CHUNK):
            row = sim[i, c0 : c0 + _CHUNK]
            out = q[i, c0 : c0 + _CHUNK]
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


@nb.njit(cache=True, inline="always")
def _excess(a: np.uint16, b: np.uint16) -> np.uint32:
    """max(0, a - b) for uint16 grid values, written so that LLVM emits a saturating 16-bit
    subtract and 32-bit lane sums (vpsubusw + vpmovzxwd + vpaddd). Numba's usual int32
    arithmetic widens to int64 lanes, which made the row scans about 3x slower when the row is
    in cache. Callers keep uint32 partial sums of at most _CHUNK terms (< 2**31)."""
    return np.uint32(np.uint16(a - b) if a > b else np.uint16(0))


@nb.njit(cache=True)
def _facility_full(q: np.ndarray, x: int, msim: np.ndarray) -> int:
    """sum_v max(0, q[x, v] - msim[v]) as an exact integer (int32 SIMD partial sums)."""
    row = q[x]
    n = msim.shape[0]
    total = 0
    for c0 in range(0, n, _CHUNK):
        # Slices indexed from 0: LLVM vectorises this form, not range(c0, c1) (10x here).
        r = row[c0 : c0 + _CHUNK]
        m = msim[c0 : c0 + _CHUNK]
        acc = np.uint32(0)
        for v in range(r.shape[0]):
            acc = np.uint32(acc + _excess(r[v], m[v]))
        total += acc
    return total


@nb.njit(cache=True)
def _facility_four(q: np.ndarray, xs: np.ndarray, msim: np.ndarray, out: np.ndarray) -> None:
    """out[i] = _facility_full(q, xs[i], msim) for four rows in one pass: four concurrent row
    streams hide more DRAM latency than one (random 8 KiB rows at |G| = 4096)."""
    r0 = q[xs[0]]
    r1 = q[xs[1]]
    r2 = q[xs[2]]
    r3 = q[xs[3]]
    n = msim.shape[0]
    t0 = 0
    t1 = 0
    t2 = 0
    t3 = 0
    for c0 in range(0, n, _CHUNK):
        a = r0[c0 : c0 + _CHUNK]
        b = r1[c0 : c0 + _CHUNK]
        c = r2[c0 : c0 + _CHUNK]
        d = r3[c0 : c0 + _CHUNK]
        m = msim[c0 : c0 + _CHUNK]
        s0 = np.uint32(0)
        s1 = np.uint32(0)
        s2 = np.uint32(0)
        s3 = np.uint32(0)
        for v in range(m.shape[0]):
            mv = m[v]
            s0 = np.uint32(s0 + _excess(a[v], mv))
            s1 = np.uint32(s1 + _excess(b[v], mv))
            s2 = np.uint32(s2 + _excess(c[v], mv))
            s3 = np.uint32(s3 + _excess(d[v], mv))
        t0 += s0
        t1 += s1
        t2 += s2
        t3 += s3
    out[0] = t0
    out[1] = t1
    out[2] = t2
    out[3] = t3


@nb.njit(cache=True, inline="always")
def _diversity(q: np.ndarray, x: int, msim: np.ndarray, w_div: float, dispersion: bool) -> int:
    """Integer diversity gain of x: facility sum_v max(0, q[x, v] - msim[v]), or for the
    dispersion rule 2**15 - msim[x] (msim[x] = max_{s in S} q[x, s] by symmetry)."""
    if w_div == 0.0:
        return 0
    if dispersion:
        return SCALE - np.int64(msim[x])
    return _facility_full(q, x, msim)


@nb.njit(cache=True)
def _score(
    x: int,
    fac: int,
    static: np.ndarray,
    bins: np.ndarray,
    alpha: np.ndarray,
    counts: np.ndarray,
    w_div: float,
    w_len: float,
) -> float:
    """Marginal gain from the exact integer facility gain: one formula for every method, so equal
    integers give bit-identical gains whatever loop produced them."""
    g = static[x]
    if w_div != 0.0:
        g += w_div * (fac / SCALE)
    if w_len != 0.0:
        b = bins[x]
        g += w_len * alpha[b] * math.log1p(1.0 / (counts[b] + 1.0))
    return g


@nb.njit(cache=True)
def _take(q: np.ndarray, x: int, msim: np.ndarray, bins: np.ndarray, counts: np.ndarray) -> None:
    counts[bins[x]] += 1
    row = q[x]
    for v in range(msim.shape[0]):
        msim[v] = max(msim[v], row[v])


@nb.njit(cache=True)
def _greedy_standard(
    q: np.ndarray,
    static: np.ndarray,
    bins: np.ndarray,
    alpha: np.ndarray,
    budget: int,
    w_div: float,
    w_len: float,
    dispersion: bool,
) -> np.ndarray:
    """Reference loop: every step scans every full row (dispersion: every msim entry)."""
    n = q.shape[0]
    msim = np.zeros(n, dtype=np.uint16)
    counts = np.zeros(alpha.shape[0], dtype=np.int64)
    taken = np.zeros(n, dtype=np.bool_)
    out = np.empty(min(budget, n), dtype=np.int64)
    k = 0
    while k < out.shape[0]:
        best = -np.inf
        best_x = -1
        for x in range(n):
            if taken[x]:
                continue
            fac = _diversity(q, x, msim, w_div, dispersion)
            g = _score(x, fac, static, bins, alpha, counts, w_div, w_len)
            if g > best:
                best = g
                best_x = x
        if best_x < 0 or not best > 0.0:
            break
        taken[best_x] = True
        _take(q, best_x, msim, bins, counts)
        out[k] = best_x
        k += 1
    return out[:k]


@nb.njit(cache=True)
def _before(keys: np.ndarray, ids: np.ndarray, i: int, j: int) -> bool:
    """Heap order: larger key first, then lower item index (the standard loop's tie rule)."""
    return keys[i] > keys[j] or (keys[i] == keys[j] and ids[i] < ids[j])


@nb.njit(cache=True)
def _swap(keys: np.ndarray, ids: np.ndarray, stamp: np.ndarray, i: int, j: int) -> None:
    keys[i], keys[j] = keys[j], keys[i]
    ids[i], ids[j] = ids[j], ids[i]
    stamp[i], stamp[j] = stamp[j], stamp[i]


@nb.njit(cache=True)
def _sift_down(keys: np.ndarray, ids: np.ndarray, stamp: np.ndarray, i: int, size: int) -> None:
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        top = left
        right = left + 1
        if right < size and _before(keys, ids, right, left):
            top = right
        if not _before(keys, ids, top, i):
            return
        _swap(keys, ids, stamp, i, top)
        i = top


@nb.njit(cache=True)
def _sift_up(keys: np.ndarray, ids: np.ndarray, stamp: np.ndarray, i: int) -> None:
    while i > 0:
        parent = (i - 1) // 2
        if not _before(keys, ids, i, parent):
            return
        _swap(keys, ids, stamp, i, parent)
        i = parent


@nb.njit(cache=True)
def _greedy_lazy(
    q: np.ndarray,
    static: np.ndarray,
    bins: np.ndarray,
    alpha: np.ndarray,
    budget: int,
    w_div: float,
    w_len: float,
    rowsum: np.ndarray,
    batched: bool,
    dispersion: bool,
) -> np.ndarray:
    """Lazy greedy. ``rowsum``: row sums of q (the initial facility gains, from the quantisation
    pass), or an empty array to compute them here. ``batched``: re-evaluate up to four stale
    tops per pass (same selection). ``dispersion``: the dispersion rule, whose gains also only
    shrink as S grows, so stale gains stay upper bounds (re-evaluation is O(1) there)."""
    n = q.shape[0]
    msim = np.zeros(n, dtype=np.uint16)
    counts = np.zeros(alpha.shape[0], dtype=np.int64)
    out = np.empty(min(budget, n), dtype=np.int64)
    keys = np.empty(n, dtype=np.float64)
    ids = np.arange(n)
    stamp = np.zeros(n, dtype=np.int64)
    have_sums = rowsum.shape[0] == n
    for x in range(n):
        if have_sums and w_div != 0.0 and not dispersion:
            fac = rowsum[x]
        else:
            fac = _diversity(q, x, msim, w_div, dispersion)
        keys[x] = _score(x, fac, static, bins, alpha, counts, w_div, w_len)
    batch = np.zeros(4, dtype=np.int64)
    facs = np.zeros(4, dtype=np.int64)
    size = n
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(keys, ids, stamp, i, size)
    k = 0
    while k < out.shape[0] and size > 0:
        if stamp[0] == k:
            # Fresh at the top: its exact gain beats every other upper bound.
            if not keys[0] > 0.0:
                break
            x = ids[0]
            _take(q, x, msim, bins, counts)
            out[k] = x
            k += 1
            size -= 1
            keys[0], ids[0], stamp[0] = keys[size], ids[size], stamp[size]
            _sift_down(keys, ids, stamp, 0, size)
        elif w_div == 0.0 or not batched or dispersion:
            x = ids[0]
            fac = _diversity(q, x, msim, w_div, dispersion)
            keys[0] = _score(x, fac, static, bins, alpha, counts, w_div, w_len)
            stamp[0] = k
            _sift_down(keys, ids, stamp, 0, size)
        else:
            # Pop up to four stale tops and re-evaluate them in one pass. Extra re-evaluations
            # only tighten upper bounds, so the selection is unchanged (fresh tops still win).
            cnt = 0
            while cnt < 4 and size > 0 and stamp[0] != k:
                batch[cnt] = ids[0]
                cnt += 1
                size -= 1
                keys[0], ids[0], stamp[0] = keys[size], ids[size], stamp[size]
                _sift_down(keys, ids, stamp, 0, size)
            for i in range(cnt, 4):
                batch[i] = batch[0]
            _facility_four(q, batch, msim, facs)
            for i in range(cnt):
                x = batch[i]
                keys[size] = _score(x, facs[i], static, bins, alpha, counts, w_div, w_len)
                ids[size] = x
                stamp[size] = k
                _sift_up(keys, ids, stamp, size)
                size += 1
    return out[:k]


@nb.njit(cache=True)
def _greedy_stochastic(
    q: np.ndarray,
    static: np.ndarray,
    bins: np.ndarray,
    alpha: np.ndarray,
    budget: int,
    w_div: float,
    w_len: float,
    sample_size: int,
    rng: np.random.Generator,
    dispersion: bool,
) -> np.ndarray:
    n = q.shape[0]
    msim = np.zeros(n, dtype=np.uint16)
    counts = np.zeros(alpha.shape[0], dtype=np.int64)
    out = np.empty(min(budget, n), dtype=np.int64)
    pool = np.arange(n)
    remaining = n
    k = 0
    while k < out.shape[0]:
        s = min(sample_size, remaining)
        # Partial Fisher-Yates: pool[:s] becomes a uniform sample without replacement.
        for i in range(s):
            j = i + rng.integers(0, remaining - i)
            pool[i], pool[j] = pool[j], pool[i]
        best = -np.inf
        best_pos = -1
        for scan in range(2):
            # Second pass (whole pool) only when the sample had no positive gain, so the loop
            # stops exactly when no candidate has a positive gain.
            limit = s if scan == 0 else remaining
            for p in range(limit):
                x = pool[p]
                fac = _diversity(q, x, msim, w_div, dispersion)
                g = _score(x, fac, static, bins, alpha, counts, w_div, w_len)
                if g > best or (g == best and x < pool[best_pos]):
                    best = g
                    best_pos = p
            if best > 0.0:
                break
        if best_pos < 0 or not best > 0.0:
            break
        x = pool[best_pos]
        _take(q, x, msim, bins, counts)
        out[k] = x
        k += 1
        remaining -= 1
        pool[best_pos] = pool[remaining]
    return out[:k]


@nb.njit(cache=True)
def _max_and_row_sums(q: np.ndarray, rowsum: np.ndarray) -> int:
    """Largest value of a uint16 matrix; rowsum[i] = sum of row i (int32 SIMD partial sums)."""
    worst = 0
    for i in range(q.shape[0]):
        total = 0
        for c0 in range(0, q.shape[1], _CHUNK):
            row = q[i, c0 : c0 + _CHUNK]
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


def validity_pool(valid: np.ndarray, static: np.ndarray, ratio: float) -> np.ndarray:
    """Indices (ascending) of the gated pool: all valid items plus the best invalid ones.

    Invalid items are ranked by static score (ties: lower index) and admitted while
    n_valid / |pool| >= ratio still holds. ``ratio`` 0 keeps every item, 1 keeps valid items only.
    """
    valid = np.asarray(valid, dtype=bool)
    static = np.asarray(static, dtype=np.float64)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"gating_ratio must be in [0, 1], got {ratio}")
    n_valid = int(valid.sum())
    invalid = np.flatnonzero(~valid)
    if ratio == 0.0:
        n_inv = invalid.size
    else:
        bound = n_valid * (1.0 - ratio) / ratio
        n_inv = invalid.size if bound >= invalid.size else math.floor(bound)
        # Guard the float floor: admit exactly the largest count satisfying the ratio.
        while n_inv > 0 and n_valid < ratio * (n_valid + n_inv):
            n_inv -= 1
        while n_inv < invalid.size and n_valid >= ratio * (n_valid + n_inv + 1):
            n_inv += 1
    order = invalid[np.lexsort((invalid, -static[invalid]))]
    return np.sort(np.concatenate([np.flatnonzero(valid), order[:n_inv]]))


def _check_vector(name: str, arr: np.ndarray, n: int) -> None:
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape [{n}] (one per ground-set item), got {arr.shape}")


def _prepare(
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    w_div: float,
    w_len: float,
    bin_alpha: np.ndarray | None,
    valid: np.ndarray | None,
    gating_ratio: float,
    check_symmetry: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validate inputs; return (pool, quantised sim on pool, static, bins on pool, alpha, row
    sums of the quantised sim on pool, or an empty array when the pool is a strict subset)."""
    if not isinstance(similarity, QuantisedSimilarity):
        similarity = QuantisedSimilarity.from_float(similarity, check_symmetry=check_symmetry)
    q, rowsum = similarity.values, similarity.row_sums
    n = q.shape[0]
    static_arr = np.asarray(static, dtype=np.float64)
    _check_vector("static", static_arr, n)
    if not np.all(np.isfinite(static_arr)):
        raise ValueError("static contains NaN or infinite values")
    bins = np.asarray(length_bin)
    _check_vector("length_bin", bins, n)
    if n and not np.issubdtype(bins.dtype, np.integer):
        raise ValueError(f"length_bin must be an integer array, got dtype {bins.dtype}")
    bins = bins.astype(np.int64)
    if n and bins.min() < 0:
        raise ValueError("length_bin must be non-negative")
    n_bins = int(bins.max()) + 1 if n else 1
    for name, w in (("w_div", w_div), ("w_len", w_len)):
        if not (math.isfinite(w) and w >= 0.0):
            raise ValueError(f"{name} must be a finite non-negative number, got {w}")
    if bin_alpha is None:
        alpha = np.ones(n_bins, dtype=np.float64)
    else:
        alpha = np.asarray(bin_alpha, dtype=np.float64)
        if alpha.ndim != 1 or alpha.shape[0] < n_bins:
            raise ValueError(
                f"bin_alpha must be 1-D with at least {n_bins} bins, got {alpha.shape}"
            )
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
            raise ValueError("bin_alpha must be finite and non-negative")
    if not 0.0 <= gating_ratio <= 1.0:
        raise ValueError(f"gating_ratio must be in [0, 1], got {gating_ratio}")
    if valid is None:
        pool = np.arange(n)
    else:
        valid_arr = np.asarray(valid)
        _check_vector("valid", valid_arr, n)
        if valid_arr.dtype != np.bool_:
            raise ValueError(f"valid must be a bool array, got dtype {valid_arr.dtype}")
        pool = validity_pool(valid_arr, static_arr, gating_ratio)
    if pool.size != n:
        q = q[np.ix_(pool, pool)]
        rowsum = np.empty(0, dtype=np.int64)
    return pool, q, static_arr[pool], bins[pool], alpha, rowsum


def subm_select(
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    budget: int,
    *,
    w_div: float = 1.0,
    w_len: float = 1.0,
    bin_alpha: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    gating_ratio: float = 0.0,
    method: str = "lazy",
    epsilon: float = 0.1,
    rng: np.random.Generator | None = None,
    check_symmetry: bool = True,
    diversity: str = "facility",
) -> np.ndarray:
    """Greedy SubM selection; returns int64 indices into the ground set, in selection order.

    Args:
        similarity: [n, n] symmetric float similarity in [0, 1] (rounded to the 2**-15 grid
            here), or a ``QuantisedSimilarity`` already on it (no rounding, no checks).
        static: [n] static score s(x) = w_rew r(x) + w_val 1[valid(x)] (caller's weights).
        length_bin: [n] non-negative integer length bin of each item.
        budget: maximum number of items to select (>= 0).
        w_div, w_len: weights of the facility and length-coverage terms (>= 0).
        bin_alpha: [n_bins] non-negative bin weights alpha_b; ``None`` is uniform 1.
        valid: [n] bool validity, needed for gating; ``None`` treats all as valid.
        gating_ratio: rho in [0, 1] (see module docstring).
        method: ``standard``, ``lazy`` (default, same result as standard) or ``stochastic``.
        epsilon: stochastic greedy accuracy in (0, 1); sample size ceil(n / budget log(1/eps)).
        rng: generator seeding the stochastic method (required for it, ignored otherwise).
        check_symmetry: for a float ``similarity``, verify |S - S^T| <= one grid step
            (2**-15) over all pairs. The check reads the matrix column-wise and costs more
            than the lazy selection at |G| = 4096 (~18 vs ~12 ms); callers whose matrix is
            symmetric by construction may turn it off (or pass ``SimilarityCache.quantised``'s
            matrix, which needs neither the check nor the rounding). Range and NaN checks
            always run.
        diversity: ``facility`` (default: the paper's facility-location term above) or
            ``dispersion``, the released reference code's rule, offered for comparison: the
            diversity gain of x is w_div (1 - max_{s in S} sim(x, s)) (w_div for S empty). It
            is not the marginal gain of a set function, so no approximation guarantee holds,
            but gains still only shrink as S grows and ``lazy`` still equals ``standard``.
    """
    if diversity not in DIVERSITY:
        raise ValueError(f"diversity must be one of {DIVERSITY}, got {diversity!r}")
    dispersion = diversity == "dispersion"
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 0:
        raise ValueError(f"budget must be a non-negative integer, got {budget!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    pool, sim, static_p, bins_p, alpha, rowsum = _prepare(
        similarity, static, length_bin, w_div, w_len, bin_alpha, valid, gating_ratio, check_symmetry
    )
    budget = int(budget)
    if budget == 0 or pool.size == 0:
        return np.empty(0, dtype=np.int64)
    if method == "standard":
        picked = _greedy_standard(sim, static_p, bins_p, alpha, budget, w_div, w_len, dispersion)
    elif method == "lazy":
        batched = pool.size >= LAZY_BATCH_MIN_N
        picked = _greedy_lazy(
            sim, static_p, bins_p, alpha, budget, w_div, w_len, rowsum, batched, dispersion
        )
    else:
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
        if rng is None:
            raise ValueError("rng is required for method='stochastic'")
        m = pool.size
        sample_size = max(1, math.ceil(m / min(budget, m) * math.log(1.0 / epsilon)))
        picked = _greedy_stochastic(
            sim, static_p, bins_p, alpha, budget, w_div, w_len, sample_size, rng, dispersion
        )
    return pool[picked]


def subm_value(
    selected: np.ndarray,
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    *,
    w_div: float = 1.0,
    w_len: float = 1.0,
    bin_alpha: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    gating_ratio: float = 0.0,
) -> float:
    """f(S) in float64 for ``selected`` (distinct indices into the ground set, all in the pool),
    on the same 2**-15 quantised similarity as ``subm_select``."""
    pool, sim, static_p, bins_p, alpha, _ = _prepare(
        similarity, static, length_bin, w_div, w_len, bin_alpha, valid, gating_ratio
    )
    sel = np.asarray(selected, dtype=np.int64).reshape(-1)
    if np.unique(sel).size != sel.size:
        raise ValueError("selected must hold distinct indices")
    pos = np.searchsorted(pool, sel)
    if sel.size and (
        np.any(pos >= pool.size) or np.any(pool[np.minimum(pos, pool.size - 1)] != sel)
    ):
        raise ValueError("selected contains indices outside the gated pool")
    if sel.size == 0:
        return 0.0
    facility = int(sim[pos].max(axis=0).sum(dtype=np.int64)) / SCALE
    counts = np.bincount(bins_p[pos], minlength=alpha.shape[0])
    length = float(np.sum(alpha[: counts.size] * np.log1p(counts)))
    return float(static_p[pos].sum()) + w_div * facility + w_len * length


def power_bin_alpha(n_bins: int, power: float = 1.0) -> np.ndarray:
    """Bin weights alpha_b = ((b + 1) / n_bins) ** power, b = 0..n_bins-1 (favours long bins)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    return ((np.arange(n_bins) + 1.0) / n_bins) ** power
