"""GFlowNetTrainer (raptb's objective inside TRL) against ``raptb train``, on the CPU.

Usage (from the repository root; needs ``pip install -e '.[trl]'``):

    python benchmarks/trl_gflownet.py [--steps 100] [--batch-size 32] [--grad-accum 4]
        [--seed 0] [--json FILE]

Both sides train the embedded tiny model (``load_model_and_tokenizer("tiny", seed)``: the same
initial weights, 110k parameters, character tokenizer) on Expr24 for ``--steps`` optimizer steps
of ``batch-size x grad-accum`` trajectories, RapTB (the paper's Expr24 column: k_min 7 -> 3 over
the run, lambda 50, kappa 0, logZ lr 0.1, policy lr 1e-3, clip 0.5) with SubM replay (Expr24's
preset: w_len 0, validity = correct, gating 1, character bigrams), one thread:

- ``raptb train``: its defaults otherwise (grammar-constrained rollout, 3 to 9 tokens, the
  behaviour temperature mix, whole micro-batches drawn from the buffer with probability
  0.5 -> 0.25);
- ``GFlowNetTrainer``: TRL's generation (no grammar, temperature 1, at most 9 tokens, the stop
  forced after 9), ``num_generations = batch-size`` over one prompt, a replayed fraction
  0.5 -> 0.25 of each generation batch, the Expr24 score as the TRL reward function; once over
  the whole vocabulary and once with the sampler restricted to Expr24's alphabet and EOS (TRL's
  ``generation_kwargs={"suppress_tokens": ...}``, the counterpart of raptb's legal tokens without
  its grammar). The loss scores the model's full distribution either way, as raptb's does.

Reported per side: distinct correct expressions sampled on-policy over the run, Acc (the fraction
of on-policy samples equal to 24) over the last 10 % of the steps and over the run, and the wall
time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.tasks.expr24.task import Expr24Task
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer


def tail_mean(values: list[float], fraction: float = 0.1) -> float:
    n = max(1, round(len(values) * fraction))
    return statistics.fmean(values[-n:])


def run_raptb(steps: int, batch: int, accum: int, seed: int, out: Path) -> dict[str, Any]:
    config = build_config(
        overrides={
            "task": "expr24",
            "loss": "raptb",
            "replay.kind": "subm",
            "steps": steps,
            "optim.batch_size": batch,
            "optim.grad_accum": accum,
            "seed": seed,
            "threads": 1,
            "checkpoint_every": steps,
        }
    )
    start = time.perf_counter()
    Trainer(config, out, progress=False).train()
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    acc = [r["acc"] for r in records if r["acc"] is not None]
    return {
        "distinct_correct": records[-1]["unique_correct"],
        "acc_last": tail_mean(acc),
        "acc_run": statistics.fmean(acc),
        "seconds": seconds,
    }


def run_trl(
    steps: int, batch: int, accum: int, seed: int, out: Path, alphabet_only: bool = False
) -> dict[str, Any]:
    from datasets import Dataset

    from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer

    model, tokenizer = load_model_and_tokenizer("tiny", seed=seed)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    task = Expr24Task()
    correct: set[str] = set()
    acc: list[float] = []

    def expr24_reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        scores = [task.score(p, c) for p, c in zip(prompts, completions, strict=True)]
        hits = [c for c, s in zip(completions, scores, strict=True) if s.valid and s.value == 1]
        correct.update(hits)
        acc.append(len(hits) / len(completions))
        return [s.value for s in scores]

    generation_kwargs = None
    if alphabet_only:
        keep = set(tokenizer.convert_tokens_to_ids(list(task.alphabet))) | {tokenizer.eos_token_id}
        generation_kwargs = {"suppress_tokens": [i for i in range(len(tokenizer)) if i not in keep]}
    args = GFlowNetConfig(
        output_dir=str(out / "trl"),
        generation_kwargs=generation_kwargs,
        loss="raptb",
        k_min=7,
        k_min_end=3,
        reward_scale=50.0,
        replay="subm",
        subm_weights=[1.0, 1.0, 1.0, 0.0],
        subm_gating_ratio=1.0,
        replay_valid_min_reward=1.0,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.5,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accum,
        num_generations=batch,
        max_completion_length=task.max_length,
        max_steps=steps,
        seed=seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=steps,
        disable_tqdm=True,
    )
    trainer = GFlowNetTrainer(
        model=str(out / "model"),
        reward_funcs=expr24_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [task.prompt] * accum}),
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {
        "distinct_correct": len(correct),
        "acc_last": tail_mean(acc),
        "acc_run": statistics.fmean(acc),
        "seconds": seconds,
    }


SIDES = {
    "raptb train": run_raptb,
    "GFlowNetTrainer": run_trl,
    "GFlowNetTrainer, Expr24 alphabet": partial(run_trl, alphabet_only=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (name, run) in enumerate(SIDES.items()):
            folder = root / str(i)
            folder.mkdir()
            results[name] = run(a.steps, a.batch_size, a.grad_accum, a.seed, folder)
            print(name, results[name], flush=True)
    print("| side | distinct correct | Acc (last 10 % of steps) | Acc (run) | wall s |")
    print("|---|---:|---:|---:|---:|")
    for name in SIDES:
        r = results[name]
        print(
            f"| {name} | {r['distinct_correct']} | {r['acc_last']:.3f} | {r['acc_run']:.3f} "
            f"| {r['seconds']:.0f} |"
        )
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
