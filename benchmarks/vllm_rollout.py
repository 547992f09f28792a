"""Time raptb's eager rollout against vLLM's (``sampling.decode = "vllm"``), side by side.

Usage (from the repository root, in the vLLM venv, ``bash .ci/vllm.sh`` makes it):

    OMP_NUM_THREADS=N .venv-vllm/bin/python benchmarks/vllm_rollout.py --threads N \
        [--task expr24,smiles] [--rows 32,128] [--repeats 5] [--dtype float32|bfloat16]
        [--json FILE]
    python benchmarks/vllm_rollout.py --table FILE   # the markdown table of FILE's records

The policy is the one ``raptb train`` builds for SmolLM2-135M-Instruct with LoRA r16 (the task's
alphabet, grammar, stop token and lengths; float32 on the CPU). The threads are set once, before
the engine starts: in-process vLLM turns ``torch.set_num_threads`` into a no-op, so each thread
count is its own process (the script prints the torch threads before and after the engine).

For each task and number of rows, the two paths alternate on the same policy, one rollout each per
repeat (after one untimed warm-up each), so both see the same machine load. Per path: median ms per
rollout, generated tokens per second (the rows' tokens over the median), and for vLLM the share of
the rollout spent in the engine's ``generate`` (the rest builds the record from vLLM's
log-probabilities, and the prompts' ids). Also timed:
one weight sync after a change of every LoRA tensor (``VLLMEngine.sync``) and the engine's start.
``--json FILE`` appends the records to the list in FILE.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import LoraConfig
from raptb.app.task_and_policy import build_policy

DECODES = ("eager", "vllm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task", default="expr24,smiles")
    parser.add_argument("--rows", default="32,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="model_dtype"
    )
    parser.add_argument("--table", type=Path, help="print the markdown table of a --json FILE")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(args.threads)
    records = []
    for task_name in args.task.split(","):
        spec = task_spec(task_name)
        task = spec.build(spec.options())
        policy = build_policy(
            "smollm2-135m", task, 0, lora=LoraConfig(rank=16), decode="vllm", dtype=args.dtype
        )
        prompt = task.prompts()[0]
        before = torch.get_num_threads()
        from raptb.adapters.lm.vllm_rollout import engine_of

        tic = time.perf_counter()
        engine = engine_of(policy)
        start_s = time.perf_counter() - tic
        print(
            f"{task_name}: engine started in {start_s:.1f} s; torch threads {before} -> "
            f"{torch.get_num_threads()}"
        )
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.01)
        tic = time.perf_counter()
        sent = engine.sync()
        sync_s = time.perf_counter() - tic
        print(f"{task_name}: sync of {sent} tensors {sync_s * 1e3:.0f} ms")
        for rows in (int(r) for r in args.rows.split(",")):
            timed = side_by_side(policy, task, prompt, rows, args.repeats)
            for decode, figures in timed.items():
                record = {
                    "task": task_name,
                    "rows": rows,
                    "decode": decode,
                    "threads": args.threads,
                    "dtype": args.dtype,
                    **figures,
                    "sync_ms": sync_s * 1e3,
                    "engine_start_s": start_s,
                    "repeats": args.repeats,
                    "date": datetime.date.today().isoformat(),
                    "machine": f"{platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} cores",
                }
                records.append(record)
                print(json.dumps(record))
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(old + records, indent=1) + "\n")


def side_by_side(
    policy: Any, task: Any, prompt: str, rows: int, repeats: int, decodes: tuple[str, ...] = DECODES
) -> dict[str, dict[str, float | None]]:
    """Each decode path's rollout of ``rows`` rows of ``prompt``, alternating on ``policy``, one
    rollout each per repeat after one untimed warm-up each, the same generator seed for each path
    in a repeat: per path the median ms per rollout, the generated tokens per second over the
    median, and for vLLM the engine's share of the median. The policy decodes eagerly after."""
    seconds: dict[str, list[float]] = {decode: [] for decode in decodes}
    tokens: dict[str, list[int]] = {decode: [] for decode in decodes}
    engine_s: list[float] = []
    for repeat in range(repeats + 1):
        for decode in decodes:
            policy.decode = decode
            generator = torch.Generator().manual_seed(repeat)
            tic = time.perf_counter()
            rollout = policy.sample(
                prompt,
                rows,
                min_length=task.min_length,
                max_length=task.max_length,
                generator=generator,
            )
            elapsed = time.perf_counter() - tic
            if repeat:  # the first of each is a warm-up
                seconds[decode].append(elapsed)
                tokens[decode].append(int(rollout.length.sum()))
                if decode == "vllm":
                    engine_s.append(rollout.timings.model_s)
    policy.decode = "eager"
    timed: dict[str, dict[str, float | None]] = {}
    for decode in decodes:
        median = statistics.median(seconds[decode])
        timed[decode] = {
            "ms_per_rollout": median * 1e3,
            "tokens_per_s": statistics.mean(tokens[decode]) / median,
            "engine_share": statistics.median(engine_s) / median if decode == "vllm" else None,
        }
    return timed


def table(records: list[dict[str, Any]]) -> str:
    """A markdown table of ``--json`` records: per task, rows, threads and dtype, the two paths'
    median ms per rollout and eager's over vLLM's (above 1: vLLM the faster)."""
    cells: dict[tuple[str, int, int, str], dict[str, float]] = {}
    for r in records:
        key = (r["task"], r["rows"], r["threads"], r.get("dtype", "float32"))
        cells.setdefault(key, {})[r["decode"]] = r["ms_per_rollout"]
    lines = [
        "| task | rows | threads | dtype | eager ms | vLLM ms | eager / vLLM |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for (task, rows, threads, dtype), ms in cells.items():
        if {"eager", "vllm"} <= ms.keys():
            ratio = ms["eager"] / ms["vllm"]
            lines.append(
                f"| {task} | {rows} | {threads} | {dtype} | {ms['eager']:,.0f} | "
                f"{ms['vllm']:,.0f} | {ratio:.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
