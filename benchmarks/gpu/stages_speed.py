"""Speed stages of the GPU plans (issue 18's tables): the environment record, the decode table,
optimizer steps per second, the SMILES step split and the TRL anchor.

Each stage takes a ``StageContext`` and returns a JSON-ready dict; ``files`` in it maps a result
file (``rollout_speed.json``) to records the driver appends there. The measuring is the benchmark
scripts' own (``benchmarks/rollout.py``, ``train_step.py``, ``trl_anchor.py``); these functions
choose the shapes and turn their results into records.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from context import StageContext

LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "trl",
    "datasets",
    "xgrammar",
    "numba",
    "numpy",
    "rdkit",
    "safetensors",
    "raptb",
)
RECORD_FIELDS = (
    "device",
    "date",
    "model",
    "rows",
    "max_length",
    "decode",
    "decode_ms_per_token_step",
    "tokens_per_s",
    "step_s",
    "peak_mib",
    "trainer",
)
"""The fields of every ``rollout_speed.json`` record (issue 18)."""
SMOLLM2_SHAPE = "smollm2-135m-shape"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _auto() -> str:
    """The path ``sampling.decode = "auto"`` takes here."""
    import torch

    return "static" if torch.cuda.is_available() else "eager"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def environment(ctx: StageContext) -> dict[str, Any]:
    """Device, driver, CUDA, torch and library versions, the commit, the machine."""
    import torch

    smi = shutil.which("nvidia-smi")
    query = "--query-gpu=name,driver_version,memory.total"
    gpus = (
        subprocess.run([smi, query, "--format=csv,noheader"], capture_output=True, text=True)
        if smi
        else None
    )
    return {
        "device": _device(),
        "nvidia_smi": gpus.stdout.strip() if gpus else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "commit": os.environ.get("RAPTB_COMMIT"),
        "versions": {name: _version(name) for name in LIBRARIES},
        "date": _now(),
    }


def step_record(
    model: str,
    rows: int,
    length: int,
    decode: str,
    result: dict[str, Any],
    trainer: str,
    **extra: Any,
) -> dict[str, Any]:
    """A ``rollout_speed.json`` record of a whole optimizer step (``train_step.measure_steps`` or
    ``trl_anchor.run_trl``): no per-token decode figure; ``graphs_captured`` from the result's
    ``graphs`` (raptb's decoders, ``StaticDecoders.graph_summary``), false for TRL."""
    graphs = result.get("graphs") or {"captured": 0, "failed": 0}
    return {
        "device": _device(),
        "date": _now(),
        "model": model,
        "rows": rows,
        "max_length": length,
        "decode": decode,
        "decode_ms_per_token_step": None,
        "tokens_per_s": result["tokens_per_s"],
        "step_s": result["median_s"]["total"],
        "peak_mib": result["max_memory_allocated_mib"],
        "trainer": trainer,
        "graphs_captured": graphs["captured"] > 0 and not graphs["failed"],
        **extra,
    }


def _decode_table(
    ctx: StageContext, shape: str, task: str, rows: tuple[int, ...], lengths: tuple[int | None, ...]
) -> dict[str, Any]:
    """``rollout.measure`` (eager against static, same seeds) for each T and number of rows."""
    from rollout import build, measure

    model = ctx.random_model(ctx.shape(shape))
    if ctx.dry_run:
        rows, lengths = (4, 8), tuple(None if t is None else 4 for t in lengths[:1])
    args = SimpleNamespace(task=task, repeats=1 if ctx.dry_run else 5)
    records: list[dict[str, Any]] = []
    for length in lengths:
        policy, built = build(args, model, length)
        for n in rows:
            records += measure(args, policy, built, ctx.shape(shape), n)
        del policy
    for record in records:
        record |= {"trainer": "raptb", "plan_shape": shape}  # plan_shape: what a GPU run measures
    return {"records": len(records), "files": {"rollout_speed.json": records}}


def decode_1b(ctx: StageContext) -> dict[str, Any]:
    return _decode_table(ctx, "llama-1b", "fixed", (32, 128), (10, 64))


def decode_135m(ctx: StageContext) -> dict[str, Any]:
    return _decode_table(ctx, SMOLLM2_SHAPE, "fixed", (32, 128), (10, 64))


def decode_smiles(ctx: StageContext) -> dict[str, Any]:
    return _decode_table(ctx, "llama-1b", "smiles", (32, 128), (None,))


VLLM_ABSENT = (
    "vllm is not installed in this image (the slot reaches no package index and its CUDA wheel "
    "does not fit the uploads): the row waits for an image with vllm"
)


def decode_vllm(ctx: StageContext) -> dict[str, Any]:
    """Issue 55's row: vLLM's rollout (``sampling.decode = "vllm"``) against raptb's own paths,
    eager and static, on the SmolLM2-135M and 1B shapes, Expr24, 32 and 128 rows, alternating on
    one policy (``vllm_rollout.side_by_side``); recorded as skipped, with why, where the image has
    no vllm."""
    from raptb.adapters.lm.decode_mode import vllm_installed

    if not vllm_installed():
        return {"skipped": VLLM_ABSENT}
    from vllm_rollout import side_by_side

    from raptb.adapters.tasks.registry import task_spec
    from raptb.app.configuration.config import LoraConfig
    from raptb.app.task_and_policy import build_policy

    spec = task_spec("expr24")
    task = spec.build(spec.options())
    rows_list, repeats = ((4,), 1) if ctx.dry_run else ((32, 128), 3)
    records: list[dict[str, Any]] = []
    for name in (SMOLLM2_SHAPE, "llama-1b"):
        shape = ctx.shape(name)
        policy = build_policy(ctx.random_model(shape), task, 0, lora=LoraConfig(rank=16))
        decodes = ("eager", "static", "vllm") if _device() != "cpu" else ("eager", "vllm")
        for rows in rows_list:
            timed = side_by_side(policy, task, task.prompts()[0], rows, repeats, decodes)
            graphs = policy.decoders.graph_summary()
            for decode, figures in timed.items():
                records.append(
                    {
                        "device": _device(),
                        "date": _now(),
                        "model": shape,
                        "plan_shape": name,
                        "task": "expr24",
                        "rows": rows,
                        "max_length": task.max_length,
                        "decode": decode,
                        "decode_ms_per_token_step": None,
                        "tokens_per_s": figures["tokens_per_s"],
                        "step_s": None,
                        "peak_mib": None,
                        "trainer": "raptb",
                        "ms_per_rollout": figures["ms_per_rollout"],
                        "engine_share": figures["engine_share"],
                        "graphs_captured": decode == "static"
                        and graphs["captured"] > 0
                        and not graphs["failed"],
                    }
                )
        del policy
    return {"records": len(records), "files": {"rollout_speed.json": records}}


def _trainer(ctx: StageContext, model: str, overrides: dict[str, Any]) -> Any:
    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    cfg = build_config(overrides={"model": model, "replay.p_replay": [0.0, 0.0], **overrides})
    return Trainer(cfg, Path(tempfile.mkdtemp(dir=ctx.work)) / "run", progress=False)


def _steps(ctx: StageContext) -> tuple[int, int]:
    """(timed, warm-up) optimizer steps of a step measurement."""
    return (2, 1) if ctx.dry_run else (8, 2)


def expr24_steps_135m(ctx: StageContext) -> dict[str, Any]:
    """Optimizer steps per second of Expr24 on the SmolLM2-135M shape (random weights, LoRA r16,
    bf16 on CUDA), the task preset's layout, every row on-policy (train_step.measure_steps)."""
    from train_step import measure_steps

    shape = ctx.shape(SMOLLM2_SHAPE)
    layout = {"optim.batch_size": 4, "optim.grad_accum": 2} if ctx.dry_run else {}
    overrides = {"task": "expr24", **layout}
    trainer = _trainer(ctx, ctx.random_model(shape), overrides)
    steps, warmup = _steps(ctx)
    result = measure_steps(trainer, steps, warmup)
    result.pop("runs")
    result["graphs"] = trainer.policy.decoders.graph_summary()
    cfg = trainer.cfg
    rows = cfg.optim.batch_size * cfg.optim.grad_accum
    decode = trainer.policy.decode_path
    length = trainer.task.max_length
    record = step_record(shape, rows, length, decode, result, "raptb", task="expr24")
    return {
        "steps_per_s": 1 / result["median_s"]["total"],
        "rows_per_step": rows,
        "layout": f"{cfg.optim.batch_size} x {cfg.optim.grad_accum}",
        "decode": decode,
        "measure": result,
        "files": {"rollout_speed.json": [record]},
    }


def smiles_step(ctx: StageContext) -> dict[str, Any]:
    """The SMILES optimizer step of the 1B shape split by component (grammar share included)."""
    from train_step import measure_steps

    layout = {"optim.batch_size": 4, "optim.grad_accum": 2} if ctx.dry_run else {}
    trainer = _trainer(ctx, ctx.random_model(ctx.shape("llama-1b")), {"task": "smiles", **layout})
    result = measure_steps(trainer, *_steps(ctx))
    result.pop("runs")
    return {"grammar_share": result["share"]["rollout: grammar"], "measure": result}


def trl_anchor(ctx: StageContext) -> dict[str, Any]:
    """raptb's optimizer step against TRL's GRPOTrainer: same model, rows, lengths, LoRA
    (trl_anchor.run_raptb / run_trl); ``trainer`` = raptb / trl records."""
    from trl_anchor import run_raptb, run_trl

    shape = ctx.shape("llama-1b")
    model = Path(ctx.random_model(shape))
    batch, accum, lengths = (4, 2, (4,)) if ctx.dry_run else (32, 4, (10, 64))
    steps, warmup = _steps(ctx)
    args = SimpleNamespace(batch_size=batch, grad_accum=accum, steps=steps, warmup=warmup)
    records, ratios = [], {}
    for length in lengths:
        ours = run_raptb(model, length, batch, accum, args)
        theirs = run_trl(model, length, args)
        ratios[str(length)] = ours["median_s"]["total"] / theirs["median_s"]["total"]
        rows = batch * accum
        records += [
            step_record(shape, rows, length, _auto(), ours, "raptb", layout=f"{batch}x{accum}"),
            step_record(shape, rows, length, "generate", theirs, "trl"),
        ]
    return {"raptb_over_trl": ratios, "files": {"rollout_speed.json": records}}
