"""A stage's floor from its own matrix products, each timed alone at its shape.

A floor at one GFLOP/s rate (``pretrained_step.py --floor``) depends on the rate taken: this
CPU's float32 products run at 81-95 GFLOP/s a thread at 320 rows and the 49,152-wide head at
45-85, lower at 32 rows (``benchmarks/floor.py``). :class:`ProductFloor` takes each product's own
rate instead: under it, every ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` a step runs is timed once
more alone, on fresh operands of the same shapes, layouts (contiguous or transposed) and dtype,
into a reused output (the median of at least three calls after a warm one, cached by shape), and
its seconds added to a running total. The other operations whose FLOPs torch counts (attention)
are added at the 2048-square product's rate. A stage's floor is then what its products alone
would take in this process, on its thread count, with this BLAS: what the stage spends beyond it
is the rest of its work (attention, element-wise operations, copies, the framework).

Timed alone and repeated, a product's operands stay in the CPU's caches, where in a step each
weight is read once a token or a micro-batch from memory. ``ProductFloor(from_memory=True)``
times each call on operands at a new place of a 256 MiB pool (far larger than the caches), so
that every call reads them from memory as the step does: the floor of a step that streams its
weights (``decode_forward.py``: a one-row decoding forward of SmolLM2 takes ~87 ms, the time to
read its 540 MB of weights).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
MIN_SECONDS = 0.02
"""Each shape's timing runs at least this long (and at least three calls)."""


def _layout(t: torch.Tensor) -> str:
    """'c' contiguous, 't' the last two dimensions transposed from contiguous, else 'x'."""
    if t.is_contiguous():
        return "c"
    if t.transpose(-1, -2).is_contiguous():
        return "t"
    return "x"


def _like(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> torch.Tensor:
    """Fresh operand of ``shape`` laid out as ``layout`` (strided ones contiguous)."""
    if layout == "t":
        flipped = (*shape[:-2], shape[-1], shape[-2])
        return torch.randn(flipped, dtype=dtype).transpose(-1, -2)
    return torch.randn(shape, dtype=dtype)


POOL_BYTES = 256 * 2**20
"""The pool operands read from memory come from: far larger than this CPU's caches."""
_pools: dict[torch.dtype, torch.Tensor] = {}


def _in_pool(shape: tuple[int, ...], layout: str, dtype: torch.dtype, place: int) -> torch.Tensor:
    """An operand of ``shape`` laid out as ``layout``, a view of the pool at its ``place``-th
    slot (cycling through the slots the pool holds; the operand itself where it does not fit)."""
    if dtype not in _pools:
        _pools[dtype] = torch.randn(POOL_BYTES // dtype.itemsize, dtype=dtype)
    pool = _pools[dtype]
    numel = math.prod(shape)
    slots = pool.numel() // numel
    if slots == 0:
        return _like(shape, layout, dtype)
    start = (place % slots) * numel
    if layout == "t":
        flipped = (*shape[:-2], shape[-1], shape[-2])
        return pool[start : start + numel].view(flipped).transpose(-1, -2)
    return pool[start : start + numel].view(shape)


def seconds_alone(
    batched: bool, a: torch.Tensor, b: torch.Tensor, from_memory: bool = False
) -> float:
    """Median seconds of ``a @ b`` (``bmm`` when ``batched``) on fresh operands like these; with
    ``from_memory``, each call's at a new place of the pool (the module docstring)."""
    shapes = (tuple(a.shape), _layout(a), a.dtype), (tuple(b.shape), _layout(b), b.dtype)
    if from_memory:
        # a and b from the pool's two halves' slots, a new pair each call
        def operands(call: int) -> tuple[torch.Tensor, torch.Tensor]:
            return _in_pool(*shapes[0], 2 * call), _in_pool(*shapes[1], 2 * call + 1)
    else:
        fixed = _like(*shapes[0]), _like(*shapes[1])

        def operands(call: int) -> tuple[torch.Tensor, torch.Tensor]:
            return fixed

    out = torch.empty(*a.shape[:-1], b.shape[-1], dtype=a.dtype)
    product = torch.bmm if batched else torch.mm
    product(*operands(0), out=out)  # warm
    times: list[float] = []
    while len(times) < 3 or sum(times) < MIN_SECONDS:
        x, y = operands(len(times) + 1)
        start = time.perf_counter()
        product(x, y, out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def square_rate() -> float:
    """FLOP/s of a 2048 x 2048 float32 product in this process (its threads)."""
    a = torch.randn(2048, 2048)
    return 2 * 2048**3 / seconds_alone(False, a, a)


class ProductFloor(TorchDispatchMode):
    """Under it, ``seconds`` grows by each product's seconds alone (``from_memory``: its operands
    read from memory) and ``flops`` by its FLOPs (the module docstring); ``shapes`` maps each
    distinct product to its seconds."""

    def __init__(self, from_memory: bool = False) -> None:
        super().__init__()
        self.from_memory = from_memory
        self.seconds = 0.0
        self.flops = 0.0
        self.shapes: dict[tuple[Any, ...], float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func in PRODUCTS:
            a, b = args[-2:] if func in (aten.addmm.default, aten.baddbmm.default) else args[:2]
            batched = a.dim() == 3
            key = (batched, tuple(a.shape), _layout(a), tuple(b.shape), _layout(b), a.dtype)
            if key not in self.shapes:  # this mode is off inside its own handler
                self.shapes[key] = seconds_alone(batched, a, b, self.from_memory)
            self.seconds += self.shapes[key]
            self.flops += (
                2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if batched else 1)
            )
        return out
