"""What the second core can give a pretrained model's step: each kind of work the step does, on
one core alone against the same work on both cores at once.

Usage (from the repository root, nothing else running):

    python benchmarks/two_cores.py [--task expr24] [--model smollm2-135m] [--repeats 5]
        [--out FILE]

Builds the task's pretrained preset (LoRA r16) as ``raptb train`` does, on one torch thread, and
times, each repeat interleaved, the median over repeats:

- a product of the step's shape (448 x 576 by 576 x 1536, float32), 200 times;
- a decoding forward (a training rollout's decoder, ``adapters/lm/decoders.py``, the task's legal
  tokens' and stop's logits only: a prompt of 16 positions cached, then 8 tokens, the median of
  the 8) of 1, 64 and 128 rows; then 64 rows in
  each of two forked processes at once (two lanes of a 128-row rollout, ``adapters/lm/lanes.py``);
- a micro-batch's forward and backward (32 rows of 16 tokens, LoRA gradients), 2 of them.

"Both cores" runs the same work in a forked copy of the process at the same time, each timing its
own; "two cores / one" is twice one core's seconds over the mean of the two's: the throughput of
both cores against one. A decoding forward pays for reading every weight whatever
its rows (the "1 row" line); two lanes each pay it, so the rollout's two lanes can give at most
"128 rows alone" over "64 rows, both cores". Prints a markdown table and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step
from pretrained_step import cpu_model

from raptb.adapters.lm.decoders import ModelDecoder
from raptb.adapters.lm.threads import use_threads


def both_cores(work: Callable[[], float]) -> float:
    """``work`` here and in a forked copy at the same time: the mean of the seconds each reports
    (its own timing: the fork is not counted)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the copy: runs the work, reports, and leaves without the parent's cleanup
        os.close(read)
        os.write(write, repr(work()).encode())
        os._exit(0)
    os.close(write)
    mine = work()
    theirs = float(os.read(read, 64).decode())
    os.waitpid(child, 0)
    os.close(read)
    return (mine + theirs) / 2


def timed(fn: Callable[[], object], times: int = 1) -> Callable[[], float]:
    """A callable that runs ``fn`` ``times`` times and returns the seconds."""

    def run() -> float:
        start = time.perf_counter()
        for _ in range(times):
            fn()
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="expr24")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    use_threads(1)
    policy = train_step.preset_trainer(args.task, args.model).policy
    model = policy.model.eval()  # no dropout: the same work each time
    generator = torch.Generator().manual_seed(0)
    left, right = torch.randn(448, 576, generator=generator), torch.randn(1536, 576)
    columns = torch.tensor([*policy.legal_ids, policy.stop_id])

    def decoding(rows: int) -> Callable[[], float]:
        prompts = torch.randint(0, 1000, (rows, 16), generator=generator).tolist()
        tokens = torch.randint(0, 1000, (rows,), generator=generator)

        def forwards() -> float:  # the rollout's decoder: the prompts' keys and values, 8 tokens
            seconds = []
            with torch.no_grad():  # a training rollout's: its legal tokens' and stop's logits
                decoder = ModelDecoder(model, prompts, policy.pad_id, 8, True, columns=columns)
                for _ in range(8):
                    start = time.perf_counter()
                    decoder.next_logits(tokens)
                    seconds.append(time.perf_counter() - start)
            return statistics.median(seconds)

        return forwards

    batch = torch.randint(0, 1000, (32, 16), generator=generator)

    def forward_backward() -> None:
        logits = model(input_ids=batch).logits
        logits.log_softmax(-1).gather(-1, batch[..., None]).sum().backward()

    alone = {
        "product, 200 times": timed(lambda: torch.nn.functional.linear(left, right), 200),
        "decoding forward, 1 row": decoding(1),
        "decoding forward, 64 rows": decoding(64),
        "decoding forward, 128 rows": decoding(128),
        "forward + backward, 2 micro-batches of 32 rows": timed(forward_backward, 2),
    }
    shared = ["product, 200 times", "decoding forward, 64 rows"]
    shared.append("forward + backward, 2 micro-batches of 32 rows")
    seconds: dict[str, list[float]] = {name: [] for name in alone}
    together: dict[str, list[float]] = {name: [] for name in shared}
    for name in alone:
        alone[name]()  # warm
    for repeat in range(args.repeats):
        for name, work in alone.items():
            seconds[name].append(work())
            if name in shared:
                together[name].append(both_cores(work))
        print(f"repeat {repeat} done", flush=True)
    model.zero_grad(set_to_none=True)
    lines = [
        f"Command: `python benchmarks/two_cores.py --task {args.task} --model {args.model} "
        f"--repeats {args.repeats}`; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"CPU {cpu_model()}, {os.cpu_count()} cores; the median of {args.repeats} repeats.",
        "",
        "| work | one core alone, s | the same on both cores at once: each, s | two cores / one |",
        "|---|---|---|---|",
    ]
    for name in alone:
        one = statistics.median(seconds[name])
        if name in shared:
            each = statistics.median(together[name])
            lines.append(f"| {name} | {one:.4f} | {each:.4f} | {2 * one / each:.2f}x |")
        else:
            lines.append(f"| {name} | {one:.4f} | | |")
    two_lanes = statistics.median(seconds["decoding forward, 128 rows"]) / statistics.median(
        together["decoding forward, 64 rows"]
    )
    lines += ["", f"The rollout's two lanes at most: {two_lanes:.2f}x (128 rows alone over 64 rows"]
    lines[-1] += " on each core at once, a decoding forward each)."
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
