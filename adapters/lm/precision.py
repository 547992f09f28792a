"""The dtype a run's model computes in (``model_dtype``): float32, or bfloat16 base weights.

``"bfloat16"`` loads the pretrained model's weights in bfloat16, so its matrix products (the
rollout, the teacher-forced rescoring and the reference pass) run in bfloat16, which a CPU with
native bfloat16 dot products (AVX512_BF16 or AMX) multiplies about 2.2x faster than float32
(benchmarks/floor.py). What the objectives read stays float32:

- the LoRA adapters are float32 parameters (peft's ``autocast_adapter_dtype``, its default: each
  adapter casts its input up and its output back), so their gradients and AdamW's update and
  moments are float32;
- the log-softmax and the sums of log-probabilities run on the logits upcast to float32
  (``rollout_record.token_log_probs``); logZ is the algorithm's own float32 parameter.

The logits themselves are rounded to bfloat16 by the head's product (8 bits of mantissa: a logit
near 20 is off by up to ~0.04), and the base weights are the float32 ones rounded once: the
bfloat16 model is a slightly different policy, scored the same way by its rollout and its
rescoring. torch.autocast with float32 weights was measured against it on SmolLM2 and not taken
(benchmarks/pretrained_step.md, "bfloat16"): it rounds the same weights at each product, casts
them again at every forward, and its gradients were further from float32's.

Refused on the CPU (ValueError, one line) where it cannot pay or cannot run: the embedded model
(its compiled CPU kernels and ONNX graphs are float32), a model without LoRA adapters (full
fine-tuning would update bfloat16 weights, whose 8-bit mantissa loses small updates), and a CPU
without native bfloat16 dot products (torch emulates them there, slower than float32). On a CUDA
GPU ``"bfloat16"`` is ``"auto"``'s choice where the GPU supports it (untested here: no GPU).

Free of torch at import (torch is imported when a dtype is resolved), so that the configuration
can name the choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

ModelDtype = Literal["auto", "float32", "bfloat16"]
MODEL_DTYPES: tuple[ModelDtype, ...] = ("auto", "float32", "bfloat16")
_TINY = "tiny"


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bfloat16 dot products (x86 AVX512_BF16 or AMX tiles), as
    torch's CPU capability probes report them (False where torch has no such probe)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, probe, lambda: False)()) for probe in probes)


def model_dtype(
    requested: ModelDtype, model_name: str, device: torch.device, *, lora: bool
) -> torch.dtype:
    """The dtype a model's weights load in for ``requested`` on ``device``.

    ``"auto"``: bfloat16 on a CUDA device that supports it, float32 otherwise. ``"float32"``:
    float32. ``"bfloat16"``: bfloat16, refused with a ValueError (one line saying what to do) on
    a CUDA device without bfloat16, and on the CPU for the embedded model, without LoRA adapters
    (``lora`` False) or without native bfloat16 (:func:`cpu_has_bf16`).
    """
    import torch

    if requested == "auto":
        from raptb.adapters.lm.lora import preferred_dtype

        return preferred_dtype(device)
    if requested not in MODEL_DTYPES:
        raise ValueError(f"model_dtype: {requested!r} is not one of auto, float32, bfloat16")
    if requested == "float32":
        return torch.float32
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ValueError(
                "model_dtype: this GPU does not support bfloat16; set model_dtype = 'float32'"
            )
        return torch.bfloat16
    if model_name == _TINY:
        raise ValueError(
            "model_dtype: 'bfloat16' is for a pretrained model; the embedded 'tiny' model's "
            "compiled CPU kernels are float32: drop --model_dtype (or set 'float32')"
        )
    if not lora:
        raise ValueError(
            "model_dtype: 'bfloat16' on a CPU trains LoRA adapters in float32 over bfloat16 base "
            "weights; set --lora-rank (e.g. 16) or model_dtype = 'float32'"
        )
    if not cpu_has_bf16():
        raise ValueError(
            "model_dtype: this CPU has no native bfloat16 dot products (AVX512_BF16 or AMX), "
            "where bfloat16 runs slower than float32; set model_dtype = 'float32'"
        )
    return torch.bfloat16


def dtype_name(dtype: torch.dtype) -> Literal["float32", "bfloat16"]:
    """``"float32"`` or ``"bfloat16"``: the name ``model_dtype`` records for a resolved dtype."""
    import torch

    if dtype == torch.float32:
        return "float32"
    if dtype == torch.bfloat16:
        return "bfloat16"
    raise ValueError(f"model_dtype: {dtype} is neither float32 nor bfloat16")
