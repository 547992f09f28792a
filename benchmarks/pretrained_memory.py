"""A pretrained model's training steps with freed memory kept and without: each step's seconds,
page faults and resident memory.

Usage (from the repository root):

    python benchmarks/pretrained_memory.py [--task smiles] [--steps 8] [--threads 1]
        [--model smollm2-135m] [--out FILE]

Two processes, one after the other (``keep_freed_memory`` true, then false), each building the
trainer of ``--task``'s pretrained preset (128 rows a step, as ``pretrained_step.py
--grad-accum 4``) and taking ``--steps`` optimizer steps through ``train_step``'s stages; after
each step the process's minor page faults in it (``getrusage``) and its resident memory
(``/proc/self/statm``). Prints a markdown table and writes it to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(args: argparse.Namespace) -> None:
    """Print one JSON line a step: wall seconds, page faults, resident GiB."""
    sys.path.insert(0, str(HERE))
    import torch
    import train_step

    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    ns = argparse.Namespace(
        batch_size=32, grad_accum=4, replay="subm", task=args.task, kappa=None, length=10
    )
    overrides = train_step.step_overrides(ns, args.model)
    overrides |= {"threads": args.threads, "keep_freed_memory": args.keep == "true"}
    run = Path(tempfile.mkdtemp()) / "run"
    trainer = Trainer(build_config(overrides=overrides), run, progress=False)
    torch.manual_seed(0)
    for _ in range(args.steps):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        train_step.timed_optimizer_step(trainer)
        wall = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        resident = int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**30
        print(json.dumps({"wall": wall, "faults": faults, "resident": resident}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="smiles")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep", default=None, help=argparse.SUPPRESS)  # a worker's arm
    args = parser.parse_args()
    if args.keep is not None:
        worker(args)
        return
    runs = {}
    for keep in ("true", "false"):
        command = [sys.executable, __file__, "--keep", keep, "--task", args.task]
        command += ["--steps", str(args.steps), "--threads", str(args.threads)]
        command += ["--model", args.model]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        runs[keep] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    lines = [
        f"Command: `python benchmarks/pretrained_memory.py {' '.join(sys.argv[1:])}`; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {args.model}, {args.task}, "
        f"128 rows a step, {args.threads} thread(s); the kept arm first, then the other.\n",
        "| step | kept: wall s | faults | resident GiB | not kept: wall s | faults "
        "| resident GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(zip(runs["true"], runs["false"], strict=True)):
        cells = [f"{r['wall']:.1f} | {r['faults']:,} | {r['resident']:.2f}" for r in (a, b)]
        lines.append(f"| {i} | {cells[0]} | {cells[1]} |")
    kept, other = (statistics.median(r["wall"] for r in v[2:] or v) for v in runs.values())
    lines.append(
        f"\nMedian of steps 2 on (all where fewer): kept {kept:.1f} s, not kept {other:.1f} s."
    )
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
