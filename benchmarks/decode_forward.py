"""One decoding forward of a pretrained model with LoRA (one token a row after an 8-token cache),
by rows: what a forward costs besides its products (streaming the weights) on one thread.

Usage (from the repository root): python benchmarks/decode_forward.py [--model smollm2-135m]
    [--rows 1 64 128] [--repeats 8] [--threads 1]

Builds the task's pretrained preset (LoRA r16) as ``raptb train`` does, in eval mode (no dropout),
and prints the median milliseconds of ``--repeats`` forwards at each row count, each through
transformers' KV cache. At one row the forward's products are matrix-vector products: its time is
that of reading the weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step

from raptb.adapters.lm.threads import use_threads
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 128])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    use_threads(args.threads)
    ns = argparse.Namespace(
        batch_size=32, grad_accum=1, replay="subm", task="expr24", kappa=None, length=10
    )
    cfg = build_config(overrides=train_step.step_overrides(ns, args.model))
    model = Trainer(cfg, Path(tempfile.mkdtemp()) / "run", progress=False).policy.model.eval()
    print(f"{args.model}, {args.threads} thread(s); median of {args.repeats} forwards")
    print("| rows | ms a forward | ms a row |\n|---|---|---|")
    for rows in args.rows:
        ids = torch.randint(0, 1000, (rows, 8))
        times = []
        with torch.no_grad():
            cache = model(input_ids=ids, use_cache=True).past_key_values
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - start)
                cache = out.past_key_values
        ms = 1000 * statistics.median(times)
        print(f"| {rows} | {ms:.1f} | {ms / rows:.2f} |")


if __name__ == "__main__":
    main()
