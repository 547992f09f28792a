"""``gemm`` (adapters/lm/embedded/gemm.py), the compiled code's float32 product, held to NumPy's
float64 product on random shapes and values, each operand transposed or not; its checks of the
shapes and of the layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.embedded import gemm


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 40),
    cols=st.integers(0, 40),
    inner=st.integers(0, 70),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_is_the_product(rows, cols, inner, trans_a, trans_b, seed) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((inner, rows) if trans_a else (rows, inner)).astype(np.float32)
    b = rng.standard_normal((cols, inner) if trans_b else (inner, cols)).astype(np.float32)
    out = np.full((rows, cols), np.nan, np.float32)  # overwritten, not accumulated into
    gemm.gemm(a, b, out, trans_a, trans_b)
    expected = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    assert np.allclose(out, expected, rtol=0, atol=1e-5 * max(1, inner))


def test_gemm_refuses_mismatched_shapes_and_strided_operands() -> None:
    a = np.ones((3, 4), np.float32)
    out = np.empty((3, 5), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        gemm.gemm(a, np.ones((5, 5), np.float32), out, False, False)
    with pytest.raises(ValueError, match="contiguous"):
        gemm.gemm(a, np.ones((4, 10), np.float32)[:, ::2], out, False, False)


def test_the_bound_library_is_torchs_mkl_where_torch_exports_one() -> None:
    assert gemm.SOURCE == ("mkl" if gemm._torch_sgemm() is not None else "scipy")
