"""Time the Vendi score of evaluation samples under Expr24's SubM kernel (character 2-gram
Jaccard), as ``raptb eval`` computes it (``raptb.core.metrics.vendi``).

Usage (from the repository root, one thread):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/vendi.py [--full]

For d distinct solutions drawn from Y* (d = 512 ... 4,096), times the d x d kernel and the
eigendecomposition. Then scores N = 6,400 draws from the uniform target over Y* (about 6,100
distinct: the worst case of a 6,400-sample evaluation, which ``sample_vendi`` subsamples to
4,096 samples) and N = 6,400 draws over 400 solutions (a trained run's spread). ``--full`` also
scores the 6,400 uniform draws without subsampling, for the subsample's bias.
"""

from __future__ import annotations

import argparse
import random
import time

from raptb.adapters.tasks.expr24.task import enumerate_solutions
from raptb.core.metrics.vendi import sample_vendi, vendi_score
from raptb.core.subm.similarity import ShingleJaccardSimilarity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also score 6,400 draws unsubsampled")
    args = parser.parse_args()
    solutions = enumerate_solutions(9)
    rng = random.Random(0)
    similarity = ShingleJaccardSimilarity(2)
    similarity.pairwise(solutions[:2], solutions[:2])  # compile the Numba kernel
    print("| distinct d | kernel (s) | eigendecomposition (s) | Vendi |")
    print("|---|---|---|---|")
    for d in (512, 1024, 2048, 4096):
        items = rng.sample(solutions, d)
        start = time.perf_counter()
        kernel = similarity.pairwise(items, items)
        middle = time.perf_counter()
        score = vendi_score(kernel)
        end = time.perf_counter()
        print(f"| {d:,} | {middle - start:.2f} | {end - middle:.2f} | {score:.1f} |")
    uniform = [rng.choice(solutions) for _ in range(6400)]
    spread = rng.sample(solutions, 400)
    trained = [rng.choice(spread) for _ in range(6400)]
    cases = [("6,400 from uniform Y*", uniform, 4096), ("6,400 over 400 solutions", trained, 4096)]
    if args.full:
        cases.append(("6,400 from uniform Y*, unsubsampled", uniform, 6400))
    print()
    print("| samples | distinct | scored samples | seconds | Vendi |")
    print("|---|---|---|---|---|")
    for name, items, cap in cases:
        start = time.perf_counter()
        estimate = sample_vendi(items, items, similarity.pairwise, max_distinct=cap)
        seconds = time.perf_counter() - start
        print(
            f"| {name} | {len(set(items)):,} | {estimate.samples:,} | {seconds:.1f} | "
            f"{estimate.score:.1f} |"
        )


if __name__ == "__main__":
    main()
