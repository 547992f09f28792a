"""GPT-2's activation, the tanh approximation of GELU, with its derivative kept from the forward.

    gelu(x) = x/2 (1 + tanh(u)),  u = c (x + a x^3),  c = sqrt(2 / pi), a = 0.044715
    gelu'(x) = (1 + tanh(u)) / 2 + x/2 (1 - tanh(u)^2) c (1 + 3 a x^2)

torch's CPU kernels for this function are slow at the embedded model's activations ([881, 256]
floats, one core: 0.6 ms forward and 0.73 ms backward per call, where ``torch.tanh`` over the same
floats takes 0.1 ms), and the backward computes tanh again. ``tanh_gelu`` computes the forward in
three passes: u (a Numba loop), tanh(u) in place (torch's own vectorised ``tanh``, the same
function torch's kernel evaluates), then gelu and gelu' from x and tanh(u) (a second Numba loop,
gelu' written over tanh(u)'s buffer); the backward is one product, the incoming gradient times the
kept gelu'. The same formulas as torch's kernels (``aten/src/ATen/native/cpu/Activation.cpp``), so
the same values up to float rounding (tests/adapters/test_tanh_gelu.py holds both to a float64
evaluation and to torch's kernels on random inputs).

``applies(act, x)`` says when the lean forward (``lean_gpt2``) uses it: the module is
transformers' tanh-approximate GELU (``gelu_pytorch_tanh``, ``gelu_new``), ``x`` a float32 CPU
tensor that needs its gradient (the rescoring; the rollout's forwards keep torch's kernel).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

_C = np.float32(0.7978845608028654)  # sqrt(2 / pi)
_A = np.float32(0.044715)
_A3 = np.float32(3 * 0.044715)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)

ACTIVATIONS = ("GELUTanh", "NewGELUActivation")
"""transformers' modules (``ACT2CLS``) that compute this function: ``gelu_pytorch_tanh``'s
(``F.gelu(approximate="tanh")``) and ``gelu_new``'s (the same written with ``torch.tanh``)."""


@nb.njit(cache=True)
def _inner(x: np.ndarray, u: np.ndarray) -> None:
    """u = c (x + a x^3), over flat float32 arrays."""
    for i in range(x.shape[0]):
        v = x[i]
        u[i] = _C * (v + _A * v * v * v)


@nb.njit(cache=True)
def _value_and_slope(x: np.ndarray, t: np.ndarray, y: np.ndarray) -> None:
    """y = gelu(x) and t = gelu'(x), given t = tanh(u) (overwritten), over flat float32 arrays."""
    for i in range(x.shape[0]):
        v = x[i]
        th = t[i]
        half_x = _HALF * v
        right = _ONE + th
        y[i] = half_x * right
        t[i] = _HALF * right + half_x * (_ONE - th * th) * _C * (_ONE + _A3 * v * v)


class _TanhGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().contiguous().view(-1)
        slope = torch.empty_like(flat)
        out = torch.empty_like(flat)
        _inner(flat.numpy(), slope.numpy())
        torch.tanh_(slope)
        _value_and_slope(flat.numpy(), slope.numpy(), out.numpy())
        ctx.save_for_backward(slope.view(x.shape))
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (slope,) = ctx.saved_tensors
        return grad * slope


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """gelu(x) with the tanh approximation (module docstring), differentiable; float32 CPU only."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"tanh_gelu takes float32 CPU tensors, not {x.dtype} on {x.device}")
    return _TanhGelu.apply(x)


def applies(act: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``tanh_gelu`` stands in for ``act`` on ``x`` (module docstring)."""
    return (
        type(act).__name__ in ACTIVATIONS
        and x.requires_grad
        and torch.is_grad_enabled()
        and x.dtype == torch.float32
        and x.device.type == "cpu"
    )
