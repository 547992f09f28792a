"""How the rollout decodes: ``eager`` (transformers' dynamic cache, ``adapters.lm.rollout``) or
``static`` (a preallocated cache and fixed buckets, ``adapters.lm.static_decode``), or ``auto``
(static on CUDA). Free of torch, so that the configuration can name the modes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DecodeMode = Literal["auto", "eager", "static"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "eager", "static")


def resolve_decode(mode: str, device: torch.device, *, sharded: bool) -> Literal["eager", "static"]:
    """The decoding path of ``mode`` on ``device``: ``auto`` is static on CUDA and eager elsewhere;
    a model sharded across processes (whose forwards are collectives) always decodes eagerly."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode: expected one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if sharded or mode == "eager":
        return "eager"
    if mode == "auto":
        return "static" if device.type == "cuda" else "eager"
    return "static"
