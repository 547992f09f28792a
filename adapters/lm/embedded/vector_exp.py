"""exp for float32 inside Numba loops, in a form LLVM vectorises.

Numba compiles ``np.exp`` of a float32 to a call of libm's ``expf``, one element at a time (no
SVML here): about 5.6 ns an element on this project's 2-core Xeon, against 1.0 ns for the
function below, whose loop LLVM turns into vector instructions. The compiled rescoring computes
~230,000 exponentials a step (the attention's probabilities and the head's softmax), so the
difference is about a millisecond a step (benchmarks/step_speed.md).

``exp32`` is Cephes' ``expf`` (Stephen L. Moshier's Cephes Math Library, ``cephes/single/
expf.c``): x = n ln 2 + r with n = round(x / ln 2) and ln 2 split in two for an exact reduction,
exp(r) by a degree-7 polynomial on |r| <= ln 2 / 2, and 2^n put into the result's exponent bits.
Within 1 ulp of exp in float64 over float32's normal range (``tests/adapters/test_vector_exp.py``).
Inputs are clamped to [-87.3365, 88.37]: below, the result is float32's smallest normal (1.2e-38)
rather than a subnormal or 0, which no sum of probabilities here can tell apart; above, 2.4e38
(the exponent bits of 2^n stay finite for n <= 127). Every exponential here is of a score minus
its maximum, at most 0.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LOWEST = np.float32(-87.33654)
"""The smallest input: exp(LOWEST) is float32's smallest normal number."""
HIGHEST = np.float32(88.37)
"""The largest input: n = round(x / ln 2) stays at most 127, so 2^n is a finite float32."""


@intrinsic
def _bits_to_float32(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the int32 ``bits``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@nb.njit(inline="always", cache=True, error_model="numpy")
def exp32(x: np.float32) -> np.float32:
    """exp(x) in float32 (module docstring)."""
    x = min(max(x, LOWEST), HIGHEST)
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    y = np.float32(1.9875691500e-4)
    y = y * r + np.float32(1.3981999507e-3)
    y = y * r + np.float32(8.3334519073e-3)
    y = y * r + np.float32(4.1665795894e-2)
    y = y * r + np.float32(1.6666665459e-1)
    y = y * r + np.float32(5.0000001201e-1)
    y = y * (r * r) + r + np.float32(1.0)
    return y * _bits_to_float32((np.int32(n) + np.int32(127)) << np.int32(23))


@nb.njit(cache=True, error_model="numpy")
def exp_into(x: np.ndarray, out: np.ndarray) -> None:
    """out = exp32(x) elementwise over 1-D float32 arrays (for the tests and benchmarks)."""
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])
