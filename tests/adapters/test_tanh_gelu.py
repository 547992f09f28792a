"""``tanh_gelu``: GPT-2's activation with its derivative kept from the forward, held to a float64
evaluation of the formula and to torch's kernels on random inputs, and used by the lean forward
only where it stands in for the model's own activation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.activations import ACT2CLS

from raptb.adapters.lm.embedded import lean_gpt2
from raptb.adapters.lm.embedded.tanh_gelu import applies, tanh_gelu


def _float64_gelu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gelu and gelu' of ``x`` in float64, written from the formula, not from torch's kernels."""
    v = x.double()
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (v + 0.044715 * v**3))
    value = 0.5 * v * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v)
    return value, slope


def _value_and_gradient(fn, x: torch.Tensor, grad: torch.Tensor):
    leaf = x.clone().requires_grad_()
    out = fn(leaf)
    out.backward(grad)
    return out.detach(), leaf.grad


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    width=st.integers(1, 300),
    scale=st.sampled_from([0.1, 1.0, 3.0, 10.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_values_and_gradients_equal_float64_and_torchs_kernels(rows, width, scale, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(rows, width, generator=generator)
    x.view(-1)[: min(6, x.numel())] = torch.tensor([-12.0, 12.0, -6.0, 6.0, 0.0, -0.5])[
        : min(6, x.numel())
    ]
    grad = torch.randn(rows, width, generator=generator)
    value, gradient = _value_and_gradient(tanh_gelu, x, grad)
    torch_value, torch_gradient = _value_and_gradient(
        lambda v: F.gelu(v, approximate="tanh"), x, grad
    )
    want_value, want_slope = _float64_gelu(x)
    want_gradient = grad.double() * want_slope
    # float32 rounding of a function of size |x| (torch's own kernels are as far, measured)
    bound = 4e-7 * (1 + x.double().abs())
    assert torch.all((value.double() - want_value).abs() <= bound)
    assert torch.all((gradient.double() - want_gradient).abs() <= 8 * bound * (1 + grad.abs()))
    torch.testing.assert_close(value, torch_value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gradient, torch_gradient, rtol=1e-5, atol=1e-5)


def test_the_slope_is_zero_and_one_where_gelu_saturates() -> None:
    """Far out tanh(u) is exactly -1 or 1: gelu' is 0 below and 1 above, as in torch's kernel."""
    x = torch.tensor([-30.0, -12.0, 12.0, 30.0])
    _, gradient = _value_and_gradient(tanh_gelu, x, torch.ones(4))
    assert gradient.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_any_shape_and_layout() -> None:
    x = torch.randn(3, 5, 7).transpose(0, 2)  # not contiguous
    value, gradient = _value_and_gradient(tanh_gelu, x, torch.ones_like(x))
    assert value.shape == x.shape and gradient.shape == x.shape
    want_value, want_slope = _float64_gelu(x)
    np.testing.assert_allclose(value.double(), want_value, atol=4e-6)
    np.testing.assert_allclose(gradient.double(), want_slope, atol=4e-6)


def test_it_refuses_other_dtypes() -> None:
    with pytest.raises(ValueError, match="float32 CPU"):
        tanh_gelu(torch.randn(4, dtype=torch.float64))


def test_it_stands_in_only_for_tanh_gelu_with_gradients() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    for name in ("gelu_pytorch_tanh", "gelu_new"):
        assert applies(ACT2CLS[name](), x)
    for name in ("gelu", "relu", "silu"):
        assert not applies(ACT2CLS[name](), x)
    act = ACT2CLS["gelu_pytorch_tanh"]()
    assert not applies(act, x.detach())
    with torch.no_grad():
        assert not applies(act, x)
    assert not applies(act, x.detach().double().requires_grad_())


def test_the_lean_forward_uses_it_in_the_rescoring(monkeypatch) -> None:
    """The MLP of a model with the tanh GELU calls ``tanh_gelu`` when gradients flow, and the
    model's own activation under ``no_grad`` (the lean forward's equality to the model's own,
    values and gradients, is tests/adapters/test_lean_gpt2.py's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=11, n_positions=16, n_embd=16, n_layer=1, n_head=2,
        activation_function="gelu_pytorch_tanh", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    calls: list[tuple[int, ...]] = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return tanh_gelu(x)

    monkeypatch.setattr(lean_gpt2, "tanh_gelu", counted)
    body = torch.tensor([[3, 4, 5], [6, 7, 8]])
    lean_gpt2.shared_prompt_logits(model, [1, 2], body).sum().backward()
    assert calls == [(2 + 2 * 3, 64)]
    with torch.no_grad():
        lean_gpt2.shared_prompt_logits(model, [1, 2], body)
    assert len(calls) == 1
