"""LoRA's dropout on a CPU: the mask from a float32 uniform an entry against one random byte an
entry (``adapters/lm/cpu_dropout.py``), at SmolLM2's LoRA inputs.

Usage (from the repository root):

    python benchmarks/dropout_mask.py [--rows 352] [--calls 200] [--rounds 5]

``FastDropout``'s forward as it ran before (``rng.random(dtype=float32) >= p``, NumPy's default
PCG64) and as it runs now (``dropped``: SFC64's raw words as bytes, compared a byte at a time),
on [rows, 576] and [rows, 1536] inputs (the attention's and the MLP's down projection's: 32 rows
of ~11 positions), p = 0.1, one thread; the two alternate in rounds and each round's mean
microseconds a call are kept, the table giving the median round. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import numpy as np
import torch

from raptb.adapters.lm.cpu_dropout import FastDropout

P = 0.1


def float_mask(x: torch.Tensor) -> torch.Tensor:
    """The forward before: a float32 uniform an entry from a fresh default generator."""
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    uniform = np.random.default_rng(seed).random(tuple(x.shape), dtype=np.float32)
    mask = np.multiply(uniform >= P, 1.0 / (1.0 - P), dtype=np.float32)
    return x * torch.from_numpy(mask)


def per_call(forward, x: torch.Tensor, calls: int) -> float:  # type: ignore[no-untyped-def]
    """Mean microseconds of ``forward(x)`` over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        forward(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=352)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = FastDropout(P).train()
    print(
        f"Command: `python benchmarks/dropout_mask.py --rows {args.rows} --calls {args.calls} "
        f"--rounds {args.rounds}`; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        "one thread.\n"
    )
    print("| input | float32 uniform us | one byte us | ratio |")
    print("|---|---|---|---|")
    for width in (576, 1536):
        x = torch.randn(args.rows, width)
        before, now = [], []
        for _ in range(args.rounds):
            before.append(per_call(float_mask, x, args.calls))
            now.append(per_call(layer, x, args.calls))
        a, b = statistics.median(before), statistics.median(now)
        print(f"| [{args.rows}, {width}] | {a:.0f} | {b:.0f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
