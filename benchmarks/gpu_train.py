"""A real training run in-process, with its throughput and peak GPU memory, then its evaluation.

Usage (from the repository root):

    python benchmarks/gpu_train.py --task expr24 --model smollm2-135m --steps 300 --out runs/e24
    python benchmarks/gpu_train.py --task smiles --model DIR --steps 200 --out runs/smi \
        --eval-samples 320 --time-limit 360

Runs the same ``Trainer`` as ``raptb train`` (configuration from ``build_config`` with the task's
presets and, for a pretrained model, LoRA r16 at lr 1e-4; bf16 on CUDA, logZ float32), so the
run directory holds the usual ``config.toml``, ``metrics.jsonl`` and checkpoints. In-process, it
also reads what the CLI cannot report: wall time, optimizer steps per second and
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` (peak of this process). With
``--time-limit S`` the run stops after the optimizer step in progress once S seconds have passed
since the trainer was built (``raptb train --time-limit``: checkpoint, then stop), so that a run
fits a fixed time budget; the summary says how many steps were done. Then ``raptb eval``'s
``evaluate`` samples ``--eval-samples`` texts from the last checkpoint. Everything goes to
``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from raptb.app.configuration.config import build_config
from raptb.app.evaluation.evaluate import evaluate
from raptb.app.training.train import Trainer

WARMUP_STEPS = 5


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return platform.processor() or "cpu"


def _peak() -> dict[str, float | None]:
    if not torch.cuda.is_available():
        return {"max_memory_allocated_mib": None, "max_memory_reserved_mib": None}
    return {
        "max_memory_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
        "max_memory_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="expr24")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-samples", type=int, default=320)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of training")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any TrainConfig field, dotted (e.g. optim.grad_accum=4); VALUE is read as JSON",
    )
    args = parser.parse_args()
    overrides: dict[str, Any] = {
        "task": args.task,
        "model": args.model,
        "steps": args.steps,
        "seed": args.seed,
        "checkpoint_every": args.steps,
    }
    if args.time_limit is not None:
        overrides["time_limit"] = args.time_limit / 60
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = _parse_value(value)
    cfg = build_config(overrides=overrides)

    start = time.perf_counter()
    trainer = Trainer(cfg, args.out, progress=False)
    setup_s = time.perf_counter() - start
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = trainer.train()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    train_s = time.perf_counter() - start
    peak = _peak()
    records = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    step_seconds = sorted(r["seconds"] for r in records)
    # the first steps hold one-off costs (numba compilation of the replay kernels, CUDA and
    # grammar warm-up); steady-state throughput is taken over the steps after them
    warm = [r["seconds"] for r in records[WARMUP_STEPS:]]
    del trainer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    start = time.perf_counter()
    metrics = evaluate(
        args.out, samples=args.eval_samples, batch_size=args.eval_batch_size, progress=False
    )
    eval_s = time.perf_counter() - start
    headline = {
        k: v for k, v in metrics.items() if isinstance(v, int | float | str | bool) or v is None
    }
    summary = {
        "task": cfg.task,
        "model": cfg.model,
        "device": _device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "dtype": "bfloat16" if torch.cuda.is_available() else "float32",
        "lora_rank": cfg.lora.rank,
        "batch_size": cfg.optim.batch_size,
        "grad_accum": cfg.optim.grad_accum,
        "steps_planned": cfg.steps,
        "steps_done": result.step,
        "stopped_by_time_limit": result.stop_reason == "time limit",
        "setup_s": setup_s,
        "train_s": train_s,
        "steps_per_s": result.step / train_s,
        "median_step_s": step_seconds[len(step_seconds) // 2],
        "steps_per_s_after_warmup": len(warm) / sum(warm) if warm else None,
        **peak,
        "final": records[-1],
        "eval_samples": args.eval_samples,
        "eval_s": eval_s,
        "eval": headline,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "final"}, indent=None))


if __name__ == "__main__":
    main()
