"""Time every objective in torch on CPU (forward + backward) against the slow float64 reference.

Usage (from the repository root):

    python benchmarks/objectives.py [--threads 1] [--repeats 200] [--markdown]

For each T in (16, 64) and B = 128: median wall time of loss + backward for float32 torch leaves
(log_pf, log_pterm, log_r, logZ with requires_grad), and of the per-trajectory Python reference of
the test suite (forward only, float64) on the same batch. Ratios are measured in one run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import OBJECTIVES, objective_by_name
from tests.core import reference as ref
from tests.core.test_objectives import make_batch

REFERENCES = {
    "tb": lambda d: ref.tb(d, 0.1),
    "subtb": lambda d: ref.subtb(d, 0.9),
    "raptb": lambda d: ref.raptb(d, 0.1, k_min=3)[0],
    "avg_prefix_tb": lambda d: ref.prefix_mean(d, 0.1),
    "root_subtb_logz": lambda d: ref.prefix_mean(d, 0.1, 0.9),
    "vargrad": lambda d: ref.vargrad(d),
}
HYPER = {"raptb": {"k_min": 3}}


def median_seconds(fn, repeats: int) -> float:
    for _ in range(min(5, repeats)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(batch_size: int, horizon: int, repeats: int) -> list[tuple[str, float, float]]:
    d = make_batch(0, batch_size, horizon, scale=50.0)
    leaves = {
        k: torch.tensor(d[k], dtype=torch.float32, requires_grad=k != "u")
        for k in ("log_pf", "log_pterm", "log_r", "u")
    }
    length = torch.as_tensor(d["length"], dtype=torch.int64)
    log_z = torch.tensor(0.1, requires_grad=True)
    rows = []
    for name in OBJECTIVES:
        obj = objective_by_name(name, **HYPER.get(name, {}))

        def step(obj=obj) -> None:
            batch = PrefixBatch(**leaves, length=length)
            loss, _ = obj(batch, log_z)
            loss.backward()

        t_torch = median_seconds(step, repeats)
        t_ref = median_seconds(lambda name=name: REFERENCES[name](d), max(3, repeats // 20))
        rows.append((name, t_torch, t_ref))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# torch {torch.__version__}, {args.threads} thread(s), "
        f"{platform.processor() or platform.machine()}",
        file=sys.stderr,
    )
    header = "| objective | T | torch fwd+bwd (ms) | reference fwd (ms) | speed-up |"
    print(header)
    print("|---|---|---|---|---|")
    for horizon in (16, 64):
        for name, t_torch, t_ref in run(args.batch_size, horizon, args.repeats):
            print(
                f"| {name} | {horizon} | {t_torch * 1e3:.3f} | {t_ref * 1e3:.1f} |"
                f" {t_ref / t_torch:.0f}x |"
            )


if __name__ == "__main__":
    main()
