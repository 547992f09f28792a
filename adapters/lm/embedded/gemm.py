"""The float32 matrix product that the compiled rollout and rescoring call from Numba.

``gemm(a, b, out, trans_a, trans_b)``: out = op(a) op(b), op a transpose or not, by the BLAS
``sgemm`` that torch itself uses where torch's library exports one (Intel MKL, linked into
torch's x86 builds), else SciPy's (OpenBLAS, the one Numba's ``np.dot`` calls). At the compiled
rescoring's shapes (~880 tokens, width 64, 256 inner) MKL's products took 0.68-0.83 of OpenBLAS's
time on one thread of this project's 2-core Xeon, the main job's step 1.04-1.05x
(benchmarks/step_speed.md), and its threads are torch's (``torch.set_num_threads``).

The compiled code calls one symbol, ``raptb_sgemm``, bound at import to the address of whichever
``sgemm`` was found (``llvmlite``'s ``add_symbol``), so Numba's on-disk cache of the callers holds
no address and stays valid in a process where the other library is the one found. Both take
Fortran's interface: column-major operands, every argument by reference; a C-contiguous array is
its transpose in column-major order, so out = op(a) op(b) is computed as out^T = op(b)^T op(a)^T.
"""

from __future__ import annotations

import ctypes
import pathlib

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic

SYMBOL = "raptb_sgemm"


def _torch_sgemm() -> int | None:
    """The address of ``sgemm_`` in torch's CPU library, or None where it exports none."""
    import torch

    folder = pathlib.Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        if (folder / name).exists():
            try:
                return ctypes.cast(ctypes.CDLL(str(folder / name)).sgemm_, ctypes.c_void_p).value
            except (AttributeError, OSError):
                return None
    return None


def _bind() -> str:
    """Bind ``SYMBOL`` to torch's ``sgemm_`` or SciPy's; which one was bound ("mkl", "scipy")."""
    address = _torch_sgemm()
    source = "mkl"
    if address is None:
        address = get_cython_function_address("scipy.linalg.cython_blas", "sgemm")
        source = "scipy"
    llvm.add_symbol(SYMBOL, address)
    return source


SOURCE = _bind()
"""Which library's ``sgemm`` ``gemm`` calls: "mkl" (torch's) or "scipy" (SciPy's OpenBLAS)."""

_sgemm = types.ExternalFunction(SYMBOL, types.void(*([types.voidptr] * 13)))


@intrinsic
def _address(typingctx, array):  # type: ignore[no-untyped-def]
    """The address of ``array``'s first element."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(data, cgutils.voidptr_t)

    return types.voidptr(array), codegen


@nb.njit(cache=True)
def _contiguous(x: np.ndarray) -> bool:
    """Whether the 2-D float32 ``x`` is C-contiguous (rows of its width, one after another)."""
    return x.strides[1] == 4 and (x.shape[0] < 2 or x.strides[0] == 4 * x.shape[1])


@nb.njit(cache=True)
def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, trans_a: bool, trans_b: bool) -> None:
    """out = op(a) op(b) for C-contiguous 2-D float32 arrays (op: the transpose where
    ``trans_a`` / ``trans_b``), overwriting ``out``."""
    rows, cols = out.shape
    inner = a.shape[0] if trans_a else a.shape[1]
    if (
        (b.shape[1] if trans_b else b.shape[0]) != inner
        or (a.shape[1] if trans_a else a.shape[0]) != rows
        or (b.shape[0] if trans_b else b.shape[1]) != cols
    ):
        raise ValueError("gemm: the operands' shapes do not match")
    if rows == 0 or cols == 0:
        return
    if inner == 0:
        out[:, :] = 0.0
        return
    if not (_contiguous(a) and _contiguous(b) and _contiguous(out)):
        raise ValueError("gemm: the operands must be C-contiguous")
    # column-major: out^T [cols, rows] = op(b)^T [cols, inner] op(a)^T [inner, rows]
    sizes = np.array([cols, rows, inner, b.shape[1], a.shape[1], cols], np.int32)
    scalars = np.array([1.0, 0.0], np.float32)
    flags = np.array([84 if trans_b else 78, 84 if trans_a else 78], np.uint8)  # "T", "N"
    _sgemm(
        _address(flags[0:]), _address(flags[1:]),
        _address(sizes[0:]), _address(sizes[1:]), _address(sizes[2:]),
        _address(scalars[0:]), _address(b), _address(sizes[3:]), _address(a), _address(sizes[4:]),
        _address(scalars[1:]), _address(out), _address(sizes[5:]),
    )  # fmt: skip
