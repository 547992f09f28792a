"""A pretrained model's policy in float32 and in bfloat16, stage by stage: the dtype arm of
``benchmarks/pretrained_step.py`` (``--dtypes``), in one process.

The dtype arm (``model_dtype``, adapters/lm/precision.py), in one process:

    python benchmarks/pretrained_step.py --dtypes [--tasks smiles expr24] [--steps 5]
        [--warmup 1] [--threads 1] [--model smollm2-135m] [--out FILE]

builds the task's policy twice (LoRA r16, dropout 0, its B weights drawn so the adapters change
every logit, the same adapter weights in both), float32 and bfloat16 base weights, and repeats,
the two in turn (the side that goes first alternating): a rollout of 32 rows (each its own, from
the same seed), then on one fixed set of 32 rows (the float32 rollout's) the reference pass and
the teacher-forced rescoring forward and backward of RapTB's loss. Stages in CPU seconds of the
process; then how far bfloat16's numbers are from float32's on those rows: the sequence
log-probabilities, the loss, the cosine of the LoRA gradients.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def _dtype_policies(args: argparse.Namespace, task_name: str) -> tuple[Any, list[Any]]:
    """The task and its policy on ``--model`` in float32 and in bfloat16 (the same LoRA r16
    adapters, B drawn, dropout 0)."""
    import torch

    from raptb.app.configuration.config import build_config
    from raptb.app.task_and_policy import build_policy, build_task

    cfg = build_config(overrides={"model": args.model, "task": task_name, "lora.dropout": 0.0})
    task = build_task(cfg)
    cpu = torch.device("cpu")
    policies = [
        build_policy(cfg.model, task, 0, lora=cfg.lora, device=cpu, dtype=dtype)
        for dtype in ("float32", "bfloat16")
    ]
    torch.manual_seed(0)
    with torch.no_grad():
        drawn = {}
        for name, param in policies[0].model.named_parameters():
            if "lora_B" in name:
                drawn[name] = param.normal_(0.0, 0.02).clone()
        for name, param in policies[1].model.named_parameters():
            if name in drawn:
                param.copy_(drawn[name])
    return task, policies


def dtype_arm(args: argparse.Namespace, task_name: str) -> list[str]:
    """``--dtypes``: float32 against bfloat16 base weights on one task, in this process."""
    import torch

    from raptb.adapters.lm.policy import to_prefix_batch
    from raptb.adapters.lm.threads import use_threads
    from raptb.core.gfn.objectives import objective_by_name

    use_threads(args.threads)
    task, policies = _dtype_policies(args, task_name)
    prompt = task.prompts()[0]
    limits = {"min_length": task.min_length, "max_length": task.max_length}
    fixed = policies[0].sample(prompt, 32, generator=torch.Generator().manual_seed(1), **limits)
    rows = torch.arange(32)
    u = torch.randn(32, fixed.tokens.shape[1] + 1, generator=torch.Generator().manual_seed(2))
    objective = objective_by_name("raptb")

    def stages(policy: Any) -> tuple[dict[str, float], dict[str, Any]]:
        times: dict[str, float] = {}
        start = time.process_time()
        policy.sample(prompt, 32, generator=torch.Generator().manual_seed(3), **limits)
        times["rollout (its own rows)"] = time.process_time() - start
        start = time.process_time()
        policy.reference_score(prompt, fixed.tokens, fixed.length)
        times["reference pass"] = time.process_time() - start
        policy.model.train()
        policy.model.zero_grad(set_to_none=True)
        start = time.process_time()
        log_pf, log_pterm = policy.score(prompt, fixed.tokens, fixed.length)
        batch = to_prefix_batch(log_pf, log_pterm, u * 10.0 + log_pterm.detach(), u, fixed.length)
        loss, _ = objective(batch, 0.0)
        loss.backward()
        times["rescoring forward + backward"] = time.process_time() - start
        times["total"] = sum(times.values())
        grads = [p.grad.flatten() for n, p in policy.model.named_parameters() if "lora_" in n]
        sequence = log_pf.sum(dim=1) + log_pterm[rows, fixed.length]
        kept = {"sequence": sequence.detach(), "loss": float(loss.detach())}
        kept["grad"] = torch.cat(grads)
        kept["grad dtypes"] = sorted({str(g.dtype) for g in grads})
        return times, kept

    runs: list[list[dict[str, float]]] = [[], []]
    kept: list[dict[str, Any]] = [{}, {}]
    for i in range(args.warmup + args.steps):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            times, kept[side] = stages(policies[side])
            if i >= args.warmup:
                runs[side].append(times)
            name = ("float32", "bfloat16")[side]
            print(f"{task_name} {name} repeat {i}: {times}", file=sys.stderr, flush=True)
    full, half = runs
    lines = [f"| {task_name}: stage | float32 CPU s | bfloat16 CPU s | float32 / bfloat16 |"]
    lines.append("|---|---|---|---|")
    for key in full[0]:
        a = statistics.median(r[key] for r in full)
        b = statistics.median(r[key] for r in half)
        lines.append(f"| {key} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    want, got = kept
    gap = (got["sequence"] - want["sequence"]).abs()
    # in float64: a float32 cosine over the ~5M LoRA gradients read 1.001 on a quiet run
    cosine = torch.nn.functional.cosine_similarity(
        got["grad"].double(), want["grad"].double(), dim=0
    )
    lines.append(
        f"\nOn the same 32 rows (lengths {sorted(set(fixed.length.tolist()))}): sequence "
        f"log-probabilities max |diff| {float(gap.max()):.3f} (mean |log p| "
        f"{float(want['sequence'].abs().mean()):.1f}); RapTB loss {want['loss']:.4g} against "
        f"{got['loss']:.4g} (relative {abs(got['loss'] / want['loss'] - 1):.1e}); "
        f"LoRA gradients' cosine {float(cosine):.5f}, bfloat16's dtypes {got['grad dtypes']}; "
        f"totals float32 {[round(r['total'], 2) for r in full]}, bfloat16 "
        f"{[round(r['total'], 2) for r in half]} CPU s\n"
    )
    return lines
