"""A pretrained model's rollout on one thread, in two lanes as threads and in two lanes with one
in a forked process, interleaved in one process.

Usage (from the repository root):

    python benchmarks/rollout_lanes.py [--task smiles] [--model smollm2-135m] [--rows 128]
        [--repeats 8] [--out FILE]

Builds the task's pretrained preset (LoRA r16) as ``raptb train`` does, on two torch threads, and
for each repeat rolls out ``--rows`` rows three ways from the same seed, one after the other: one
lane on one thread (``Lanes(1)``), two lanes as threads (``Lanes(2)``) and two lanes with the second
in a forked process (``Lanes(2, processes=True)``, the trainer's default on a CPU under Linux;
``adapters/lm/lane_process.py``). The two lane rollouts draw the same rows (checked at every repeat:
the script stops otherwise). The first call of each is not timed (the process lane forks there).
Prints a markdown table of the wall seconds (each repeat, then the mean) and the ratios against
one thread, and writes it to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step
from pretrained_step import cpu_model

from raptb.adapters.lm.lanes import Lanes
from raptb.adapters.lm.threads import use_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="smiles")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    use_threads(2)
    trainer = train_step.preset_trainer(args.task, args.model)
    policy, task = trainer.policy, trainer.task
    prompt = task.prompts()[0]
    ways = {"1 thread": (Lanes(1), 1), "2 lanes, threads": (Lanes(2), 2)}
    ways["2 lanes, a process"] = (Lanes(2, processes=True), 2)

    def roll(way: str, seed: int) -> tuple[torch.Tensor, float]:
        policy.lanes, threads = ways[way]
        use_threads(threads)
        start = time.perf_counter()
        out = policy.sample(
            [prompt] * args.rows,
            args.rows,
            min_length=task.min_length,
            max_length=task.max_length,
            generator=torch.Generator().manual_seed(seed),
            record=False,  # as a training step's rollout
        )
        return out.tokens, time.perf_counter() - start

    for way in ways:
        roll(way, 0)
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for repeat in range(args.repeats):
        rows = {}
        for way in ways:
            rows[way], took = roll(way, repeat + 1)
            seconds[way].append(took)
        if not torch.equal(rows["2 lanes, threads"], rows["2 lanes, a process"]):
            sys.exit(f"repeat {repeat}: the thread lanes and the process lanes drew other rows")
        print(f"repeat {repeat}: " + ", ".join(f"{w} {s[-1]:.2f} s" for w, s in seconds.items()))
    ways["2 lanes, a process"][0].close()
    one = statistics.mean(seconds["1 thread"])
    lines = [
        f"Command: `python benchmarks/rollout_lanes.py --task {args.task} --model {args.model} "
        f"--rows {args.rows} --repeats {args.repeats}`; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"CPU {cpu_model()}, {os.cpu_count()} cores.",
        "",
        f"| {args.task}, {args.rows} rows | wall s, each repeat | mean | one thread / this |",
        "|---|---|---|---|",
    ]
    for way, values in seconds.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        mean = statistics.mean(values)
        lines.append(f"| {way} | {each} | {mean:.2f} | {one / mean:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
