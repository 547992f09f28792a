"""How the rollout decodes: ``eager`` (transformers' dynamic cache, ``adapters.lm.rollout``),
``static`` (a preallocated cache and fixed buckets, ``adapters.lm.gpu.static_decode``), ``onnx``
(each column in one ONNX Runtime call, ``adapters.lm.embedded.onnx_rollout``: GPT-2 models in
float32 on the CPU), or ``auto`` (static on CUDA, onnx on the CPU for small models where it applies,
else eager). Free of torch, so that the configuration can name the modes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DecodeMode = Literal["auto", "eager", "static", "onnx"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "eager", "static", "onnx")
ONNX_NEEDS = (
    "a GPT-2 model the lean forward supports, in float32 on the CPU, on one process, "
    "with onnxruntime and onnx installed"
)


def resolve_decode(
    mode: str, device: torch.device, *, sharded: bool, onnx: bool = False
) -> Literal["eager", "static", "onnx"]:
    """The decoding path of ``mode`` on ``device``: ``auto`` is static on CUDA, onnx where the
    ONNX path applies to the model (``onnx``: for ``auto``
    ``adapters.lm.embedded.onnx_rollout.preferred``, for ``onnx`` its ``usable``), eager elsewhere;
    a model sharded across processes (whose forwards are collectives) always decodes eagerly.
    ValueError for an unknown mode, or ``onnx`` where it does not apply."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode: expected one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if sharded or mode == "eager":
        return "eager"
    if mode == "auto":
        if device.type == "cuda":
            return "static"
        return "onnx" if onnx else "eager"
    if mode == "onnx":
        if not onnx:
            raise ValueError(f"decode: onnx needs {ONNX_NEEDS}")
        return "onnx"
    return "static"
