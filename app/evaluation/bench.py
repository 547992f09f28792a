"""``raptb bench subm``: wall-clock cost of one SubM buffer refresh.

A refresh is what the SubM buffer does: similarity of the new items against the ground set
(``SimilarityCache.quantised``: the stored B items are already cached, the new x all block is
computed, rounded to the 2**-15 grid and mirrored) plus greedy selection of B items from |G|
candidates on that fixed-point matrix. Selection methods timed: ``standard`` and ``lazy``
(Numba, ``raptb.core.subm.select``) on the fixed-point matrix; ``lazy`` also from the float32 form
of the same matrix (the float entry point: rounding pass plus all-pairs symmetry check, and with
``check_symmetry=False``); ``numpy-lazy`` (a plain numpy + heapq lazy greedy of the same
objective on the float32 matrix, the baseline) and apricot's ``FacilityLocationSelection``
(facility term only, precomputed similarity) when importable. All see the same grid values.
``dispersion`` times the reference code's dispersion rule (``diversity="dispersion"``, lazy).

Data: Morgan-like 2048-bit fingerprints, either scaffold-conditioned (one of 8 scaffolds of 30
bits plus 15 random fragment bits, like the paper's SMILES task) or i.i.d. (45 random bits), and
Expr24-like strings for Jaccard on character 2-grams. Times are medians over repeats, in ms.
"""

from __future__ import annotations

import heapq
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from raptb.core.subm.select import QuantisedSimilarity, subm_select
from raptb.core.subm.similarity import ShingleJaccardSimilarity, TanimotoSimilarity, pack_bits
from raptb.core.subm.similarity_cache import SimilarityCache


def morgan_like(n: int, rng: np.random.Generator, data: str) -> list[np.ndarray]:
    """n packed 2048-bit fingerprints (list of [32] uint64 rows)."""
    bits = np.zeros((n, 2048), dtype=bool)
    if data == "scaffold":
        scaffolds = [rng.choice(2048, 30, replace=False) for _ in range(8)]
        for i in range(n):
            bits[i, scaffolds[int(rng.integers(0, 8))]] = True
            bits[i, rng.choice(2048, 15, replace=False)] = True
    else:
        for i in range(n):
            bits[i, rng.choice(2048, 45, replace=False)] = True
    return list(pack_bits(bits))


def expr_strings(n: int, rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(n):
        k = int(rng.integers(2, 6))
        nums = [str(int(rng.integers(1, 14))) for _ in range(k)]
        ops = [str(rng.choice(list("+-*/"))) for _ in range(k - 1)]
        out.append("".join(a + b for a, b in zip(nums, [*ops, ""], strict=True)))
    return out


def numpy_lazy_greedy(
    sim: np.ndarray, static: np.ndarray, bins: np.ndarray, budget: int, w_div: float, w_len: float
) -> list[int]:
    """Baseline: the same objective with numpy row operations and a heapq of stale gains."""
    n = sim.shape[0]
    msim = np.zeros(n, dtype=sim.dtype)
    counts = np.zeros(int(bins.max()) + 1)
    buf = np.empty(n, dtype=sim.dtype)  # reused: no temporaries per evaluation

    def gain(x: int) -> float:
        np.subtract(sim[x], msim, out=buf)
        np.maximum(buf, 0.0, out=buf)
        fac = float(buf.sum())
        return float(static[x] + w_div * fac + w_len * np.log1p(1.0 / (counts[bins[x]] + 1.0)))

    heap = [(-gain(x), x, 0) for x in range(n)]
    heapq.heapify(heap)
    chosen: list[int] = []
    while heap and len(chosen) < budget:
        neg, x, stamp = heapq.heappop(heap)
        if stamp == len(chosen):
            if -neg <= 0:
                break
            chosen.append(x)
            np.maximum(msim, sim[x], out=msim)
            counts[bins[x]] += 1
        else:
            heapq.heappush(heap, (-gain(x), x, len(chosen)))
    return chosen


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _apricot() -> Any | None:
    try:
        from apricot import FacilityLocationSelection
    except ImportError:
        return None
    return FacilityLocationSelection


def bench_refresh(
    n: int,
    budget: int,
    backend: str,
    data: str,
    repeats: int,
    slow_limit: int,
    seed: int = 0,
    slow_repeats: int | None = None,
) -> dict[str, Any]:
    """Time one refresh at |G| = n, B = budget; returns a JSON-able record.

    Similarity, the Numba lazy variants and the numpy baseline take ``repeats`` samples each
    (medians of the same count, so the speedup compares like with like); standard greedy and
    apricot, much slower, take ``slow_repeats`` (default ``repeats``)."""
    slow = repeats if slow_repeats is None else slow_repeats
    rng = np.random.default_rng(seed)
    if backend == "tanimoto":
        feats: list[Any] = list(morgan_like(n, rng, data))
        similarity: Any = TanimotoSimilarity()
    else:
        feats = list(expr_strings(n, rng))
        similarity = ShingleJaccardSimilarity(2)
    keys = list(range(n))
    static = 1.0 + rng.normal(0.0, 0.5, n).clip(-0.9, None)
    bins = rng.integers(0, 10, n)
    w_len = 1.0

    def refresh_similarity() -> QuantisedSimilarity:
        cache = SimilarityCache(similarity)
        cache.quantised(keys[:budget], feats[:budget])
        t0 = time.perf_counter()
        qs = cache.quantised(keys, feats)
        timings.append((time.perf_counter() - t0) * 1e3)
        return qs

    timings: list[float] = []
    qs = refresh_similarity()
    timings.clear()
    for _ in range(repeats):
        qs = refresh_similarity()
    # The float form of the same grid values: input of the float entry point, the numpy
    # baseline and apricot, so every method selects on identical similarities.
    sim = qs.to_float()
    record: dict[str, Any] = {
        "n": n,
        "budget": budget,
        "backend": backend,
        "data": data if backend == "tanimoto" else "expr24-strings",
        "similarity_ms": statistics.median(timings),
        "similarity_matrix_MiB": qs.values.nbytes / 2**20,
        "selection_ms": {},
    }
    sel = record["selection_ms"]
    variants: dict[str, Callable[[], object]] = {
        "lazy": lambda: subm_select(qs, static, bins, budget, w_len=w_len),
        "lazy-float": lambda: subm_select(sim, static, bins, budget, w_len=w_len),
        "lazy-float-nocheck": lambda: subm_select(
            sim, static, bins, budget, w_len=w_len, check_symmetry=False
        ),
        "dispersion": lambda: subm_select(
            qs, static, bins, budget, w_len=w_len, diversity="dispersion"
        ),
    }
    for name, fn in variants.items():
        fn()  # compile / warm
        sel[name] = _median_ms(fn, repeats)
    if n <= slow_limit:
        subm_select(qs, static, bins, budget, w_len=w_len, method="standard")
        sel["standard"] = _median_ms(
            lambda: subm_select(qs, static, bins, budget, w_len=w_len, method="standard"), slow
        )
        sel["numpy-lazy"] = _median_ms(
            lambda: numpy_lazy_greedy(sim, static, bins, budget, 1.0, w_len), repeats
        )
        same = numpy_lazy_greedy(sim, static, bins, budget, 1.0, w_len)
        lazy = subm_select(qs, static, bins, budget, w_len=w_len).tolist()
        record["numpy_lazy_same_selection"] = same == lazy
    else:
        sel["standard"] = None
        sel["numpy-lazy"] = None
    fls = _apricot()
    if fls is not None and n <= slow_limit:
        t0 = time.perf_counter()
        fls(budget, metric="precomputed", optimizer="lazy", verbose=False).fit(sim)
        sel["apricot-first"] = (time.perf_counter() - t0) * 1e3
        sel["apricot-warm"] = _median_ms(
            lambda: fls(budget, metric="precomputed", optimizer="lazy", verbose=False).fit(sim),
            max(1, slow // 2),
        )
    record["total_lazy_ms"] = record["similarity_ms"] + sel["lazy"]
    if sel.get("numpy-lazy"):
        for name in ("lazy", "lazy-float", "lazy-float-nocheck"):
            record[f"{name}_speedup_vs_numpy"] = sel["numpy-lazy"] / sel[name]
    return record


def _fmt(x: float | None) -> str:
    return "skipped" if x is None else f"{x:.2f}"


def subm(
    sizes: str = typer.Option("256,1024,4096,16384", help="Comma-separated |G| for the sweep."),
    repeats: int = typer.Option(7, min=1, help="Repeats per timing (median reported)."),
    slow_limit: int = typer.Option(
        4096, help="Largest |G| for standard greedy, the numpy baseline and apricot."
    ),
    data: str = typer.Option("scaffold", help="Fingerprint data: scaffold or iid."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable results."),
    plot: Annotated[
        Path | None,
        typer.Option(help="Also write a log-log PNG of refresh time against |G| to this path."),
    ] = None,
) -> None:
    """Time SubM refreshes: paper setting (B = 200, |G| = 232) and a |G| sweep with B = |G|/8."""
    if data not in ("scaffold", "iid"):
        raise typer.BadParameter("data must be 'scaffold' or 'iid'")
    records = [
        bench_refresh(232, 200, "tanimoto", data, repeats, slow_limit),
        bench_refresh(232, 200, "jaccard", data, repeats, slow_limit),
    ]
    for n in (int(s) for s in sizes.split(",") if s):
        slow = max(1, repeats if n <= 1024 else repeats // 3)
        records.append(
            bench_refresh(n, n // 8, "tanimoto", data, repeats, slow_limit, slow_repeats=slow)
        )
    result = {"machine": platform.processor() or platform.machine(), "records": records}
    if plot is not None:
        from raptb.app.evaluation.plots import plot_subm_scaling  # matplotlib: only when asked

        plot_subm_scaling(records, plot)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    header = (
        "| |G| | B | similarity | matrix MiB | sim ms | lazy ms | lazy float-input ms | "
        "float-input no-sym-check ms | standard ms | dispersion ms | numpy-lazy ms | "
        "apricot first / warm ms | "
        "total (lazy) ms | lazy vs numpy | float-input vs numpy | no-check vs numpy | "
        "same as numpy |"
    )
    typer.echo(header)
    typer.echo("|" + "---|" * 17)
    for rec in records:
        s = rec["selection_ms"]
        apricot = (
            f"{_fmt(s['apricot-first'])} / {_fmt(s['apricot-warm'])}"
            if "apricot-first" in s
            else "n/a"
        )
        speeds = " | ".join(
            "n/a" if (v := rec.get(f"{k}_speedup_vs_numpy")) is None else f"{v:.1f}x"
            for k in ("lazy", "lazy-float", "lazy-float-nocheck")
        )
        same = rec.get("numpy_lazy_same_selection")
        typer.echo(
            f"| {rec['n']} | {rec['budget']} | {rec['backend']} ({rec['data']}) | "
            f"{rec['similarity_matrix_MiB']:.1f} | {rec['similarity_ms']:.3f} | "
            f"{_fmt(s['lazy'])} | {_fmt(s['lazy-float'])} | {_fmt(s['lazy-float-nocheck'])} | "
            f"{_fmt(s['standard'])} | {_fmt(s['dispersion'])} | "
            f"{_fmt(s['numpy-lazy'])} | {apricot} | {rec['total_lazy_ms']:.2f} | {speeds} | "
            f"{'n/a' if same is None else ('yes' if same else 'no')} |"
        )
