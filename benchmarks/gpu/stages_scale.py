"""Scale stages of the GPU plans (issue 25): random-weight models of the paper's shapes on one
GPU, SMILES preset, LoRA r16, bf16, 128 rows per optimizer step.

The model is initialised on the device directly in bf16 (``train_step.random_llama``): nothing is
written to disk and no float32 copy exists, so a 32B shape needs its 64 GB of weights and no
more. It reaches the trainer through the model loader (``raptb.app.task_and_policy``'s
``load_model_and_tokenizer``, patched in this process only for the name ``random:SHAPE``). Per
shape: the step split with activation checkpointing off and on (micro-batches of 32), then the
largest micro-batch (128, 64, 32, 16, 8 rows) whose step runs without running out of memory.
"""

from __future__ import annotations

import gc
from typing import Any

from context import StageContext

ROWS = 128
MICRO_BATCHES = (128, 64, 32, 16, 8)


def _use_random_models(ctx: StageContext) -> None:
    """``random:SHAPE`` as a model name builds ``random_llama(SHAPE)`` on the device."""
    from train_step import random_llama
    from transformers import AutoTokenizer

    import raptb.app.task_and_policy as runtime

    original = runtime.load_model_and_tokenizer

    def load(name: str, **kwargs: Any) -> Any:
        if not name.startswith("random:"):
            return original(name, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(ctx.tokenizer_dir())
        return random_llama(name.removeprefix("random:"), tokenizer), tokenizer

    runtime.load_model_and_tokenizer = load


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _measure(
    ctx: StageContext, shape: str, batch: int, checkpointing: bool, plan_shape: str
) -> dict[str, Any]:
    """One setting's step split (train_step.measure_steps), or its out-of-memory error."""
    import torch
    from stages_speed import _device, _now, _steps, _trainer
    from train_step import measure_steps

    rows = 8 if ctx.dry_run else ROWS
    overrides = {
        "task": "smiles",
        "optim.batch_size": batch,
        "optim.grad_accum": rows // batch,
        "optim.gradient_checkpointing": checkpointing,
    }
    setting = {
        "device": _device(),
        "date": _now(),
        "shape": shape,
        "plan_shape": plan_shape,
        "rows": rows,
        "micro_batch": batch,
        "checkpointing": checkpointing,
    }
    trainer = None
    try:
        trainer = _trainer(ctx, f"random:{shape}", overrides)
        result = measure_steps(trainer, *_steps(ctx))
        result.pop("runs")
        return {**setting, "ok": True, **result}
    except torch.cuda.OutOfMemoryError as exc:
        return {**setting, "ok": False, "error": f"out of memory: {str(exc)[:300]}"}
    finally:
        del trainer
        _free()


def _scale(ctx: StageContext, plan_shape: str) -> dict[str, Any]:
    _use_random_models(ctx)
    shape = ctx.shape(plan_shape)
    batches = (8, 4) if ctx.dry_run else MICRO_BATCHES
    middle = batches[-3] if not ctx.dry_run else batches[-1]
    records = [_measure(ctx, shape, middle, on, plan_shape) for on in (False, True)]
    largest = None
    for batch in batches:  # largest first: the first that fits is the answer
        if ctx.seconds_left() < 30 and not ctx.dry_run:
            break
        record = _measure(ctx, shape, batch, True, plan_shape)
        records.append(record)
        if record["ok"]:
            largest = batch
            break
    return {"largest_micro_batch": largest, "files": {"scales.json": records}}


def scale_3b(ctx: StageContext) -> dict[str, Any]:
    return _scale(ctx, "llama-3b")


def scale_8b(ctx: StageContext) -> dict[str, Any]:
    return _scale(ctx, "llama-8b")


def scale_32b(ctx: StageContext) -> dict[str, Any]:
    return _scale(ctx, "qwen3-32b-shape")
