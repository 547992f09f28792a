"""The floor of a CPU for a training step: its matrix-product rate and memory bandwidth.

Usage (from the repository root):

    python benchmarks/floor.py [--repeats 5] [--seconds 0.5]

Prints a markdown table: torch's float32 and bfloat16 matrix products (GFLOP/s, 2mnk per
product) on one thread and on every core, at a square size (2048) and at the shapes of a
SmolLM2-135M step (width 576, MLP 1536, vocabulary 49,152; 320 tokens: 32 rows of 10; and the 32
rows of the rollout's one-token forwards), and the memory bandwidth of a 256 MiB copy (GB/s,
bytes read plus written). Each cell gives the rate per
CPU second of the process (summed over its threads: what the cores do while they run, on a
machine other jobs share) and per wall second (what a quiet machine gives), each the best of
``--repeats`` timings of about ``--seconds`` of CPU. A step's floor is its counted FLOPs
(``benchmarks/pretrained_step.py``) over the product rate.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

SHAPES = {  # (m, k, n) of [m, k] @ [k, n]
    "square 2048": (2048, 2048, 2048),
    "attention/MLP 320x576 @ 576x1536": (320, 576, 1536),
    "head 320x576 @ 576x49152": (320, 576, 49152),
    # the rollout's one-token forwards multiply 32 rows at a time
    "attention/MLP, one token of 32 rows: 32x576 @ 576x1536": (32, 576, 1536),
    "head, one token of 32 rows: 32x576 @ 576x49152": (32, 576, 49152),
}


def best_rate(fn, work: float, repeats: int, seconds: float) -> tuple[float, float]:
    """``work`` units per CPU second (of each thread, summed) and per wall second of ``fn``, each
    the best of ``repeats`` timings of ~``seconds`` of CPU."""
    fn()
    start = time.process_time()
    calls = 0
    while time.process_time() - start < seconds / 4:
        fn()
        calls += 1
    per = max(1, calls * 4)
    best_cpu = best_wall = 0.0
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(per):
            fn()
        best_cpu = max(best_cpu, work * per / (time.process_time() - cpu))
        best_wall = max(best_wall, work * per / (time.perf_counter() - wall))
    return best_cpu, best_wall


def matmul_rate(shape: tuple[int, int, int], dtype: torch.dtype, repeats: int, s: float) -> str:
    m, k, n = shape
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    out = torch.empty(m, n, dtype=dtype)
    cpu, wall = best_rate(lambda: torch.mm(a, b, out=out), 2 * m * k * n, repeats, s)
    return f"{cpu / 1e9:.0f} / {wall / 1e9:.0f}"


def bandwidth(repeats: int, seconds: float) -> str:
    src = torch.randn(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    cpu, wall = best_rate(lambda: dst.copy_(src), 2 * src.nbytes, repeats, seconds)
    return f"{cpu / 1e9:.1f} / {wall / 1e9:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    counts = sorted({1, cores})
    lines = [
        "| per CPU second / per wall second | "
        + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in counts)
        + " |",
        "|---|" + "---|" * len(counts),
    ]
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        for label, shape in SHAPES.items():
            rates = []
            for threads in counts:
                torch.set_num_threads(threads)
                rates.append(matmul_rate(shape, dtype, args.repeats, args.seconds))
            lines.append(f"| {name} GFLOP/s, {label} | {' | '.join(rates)} |")
    rates = []
    for threads in counts:
        torch.set_num_threads(threads)
        rates.append(bandwidth(args.repeats, args.seconds))
    lines.append(f"| memory GB/s, 256 MiB copy | {' | '.join(rates)} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
