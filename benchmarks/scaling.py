"""Data-parallel throughput on CPU: 1 process vs 2 processes, the same global batch.

Usage (from the repository root, in the environment raptb is installed in):

    python benchmarks/scaling.py [--steps 8] [--warmup 2] [--batch-size 16] [--rounds 2]

Each round trains the default Expr24 run (embedded tiny model, RapTB, SubM replay) once as a
plain ``raptb train`` and once under ``accelerate launch`` with 2 CPU processes (gloo), one thread
per process, in alternating order, so both see the same machine load. ``batch_size`` is the
global micro-batch, so both train on the same number of trajectories per step. Steps/s come from
the per-step ``seconds`` that rank 0 logs in metrics.jsonl (rollout to optimizer step, gradient
all-reduce included; process start-up excluded), after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"]
LAUNCH += ["--mixed_precision", "no", "--dynamo_backend", "no", "--num_processes"]


def step_seconds(processes: int, run: Path, args: argparse.Namespace) -> list[float]:
    """Seconds of each step after the warm-up, of one training run on ``processes`` processes."""
    train = [
        "-m",
        "raptb",
        "train",
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
    ]
    train += ["--grad-accum", "1", "--threads", "1", "--no-progress", "--out", str(run)]
    command = [*LAUNCH, str(processes), *train] if processes > 1 else [sys.executable, *train]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [r["seconds"] for r in records[args.warmup :]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = (1, 2) if round_ % 2 == 0 else (2, 1)
            for processes in order:
                run = Path(tmp) / f"r{round_}-p{processes}"
                seconds[processes] += step_seconds(processes, run, args)
    rate = {p: 1.0 / statistics.median(s) for p, s in seconds.items()}
    print(f"global batch {args.batch_size}, {len(seconds[1])} timed steps per setting")
    print("| processes | median s/step | steps/s | trajectories/s |")
    print("|---:|---:|---:|---:|")
    for p in (1, 2):
        median = statistics.median(seconds[p])
        print(f"| {p} | {median:.3f} | {rate[p]:.2f} | {rate[p] * args.batch_size:.1f} |")
    print(f"2-process / 1-process throughput: {rate[2] / rate[1]:.2f}x")


if __name__ == "__main__":
    main()
