"""Numba greedy loops of SubM on the fixed-point similarity (``core.subm.fixed_point``).

Inputs are already validated by ``core.subm.select``: q is the uint16 [n, n] grid similarity of the
gated pool, static [n] the static scores, bins [n] the length bins, alpha [n_bins] the bin
weights. Each loop returns the selected pool indices (int64) in selection order and stops at
``budget`` items or when no candidate has a positive gain.

``greedy_standard`` is the reference loop, ``greedy_lazy`` Minoux's lazy greedy (same
selection) and ``greedy_stochastic`` stochastic greedy; ``core.subm.select`` states the maths.

Facility gains are exact integers and the full gain is one float64 formula of that integer
(``_score``), so standard and lazy see bit-identical gains.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from raptb.core.subm.fixed_point import CHUNK, SCALE


@nb.njit(cache=True, inline="always")
def _excess(a: np.uint16, b: np.uint16) -> np.uint32:
    """max(0, a - b) for uint16 grid values, written so that LLVM emits a saturating 16-bit
    subtract and 32-bit lane sums (vpsubusw + vpmovzxwd + vpaddd). Numba's usual int32
    arithmetic widens to int64 lanes, which made the row scans about 3x slower when the row is
    in cache. Callers keep uint32 partial sums of at most CHUNK terms (< 2**31)."""
    return np.uint32(np.uint16(a - b) if a > b else np.uint16(0))


@nb.njit(cache=True)
def _facility_full(q: np.ndarray, x: int, msim: np.ndarray) -> int:
    """sum_v max(0, q[x, v] - msim[v]) as an exact integer (int32 SIMD partial sums)."""
    row = q[x]
    n = msim.shape[0]
    total = 0
    for c0 in range(0, n, CHUNK):
        # Slices indexed from 0: LLVM vectorises this form, not range(c0, c1) (10x here).
        r = row[c0 : c0 + CHUNK]
        m = msim[c0 : c0 + CHUNK]
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
    for c0 in range(0, n, CHUNK):
        a = r0[c0 : c0 + CHUNK]
        b = r1[c0 : c0 + CHUNK]
        c = r2[c0 : c0 + CHUNK]
        d = r3[c0 : c0 + CHUNK]
        m = msim[c0 : c0 + CHUNK]
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
def greedy_standard(
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
def greedy_lazy(
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
def greedy_stochastic(
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
