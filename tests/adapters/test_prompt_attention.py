"""``prompt_attention``: the rescoring's attention over a shared prompt and rows after it, as loops
over the tokens, held to torch's scaled-dot-product attention (in float64) on random inputs, values
and gradients, and to ``lean_gpt2.shared_prompt_logits``'s own path inside the model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.embedded import lean_gpt2
from raptb.adapters.lm.embedded.prompt_attention import prompt_attention, token_positions


def _sdpa(qkv: torch.Tensor, prompt: int, rows: int, heads: int, scale: float) -> torch.Tensor:
    """The same attention by torch's SDPA, as ``shared_prompt_logits`` computed it before: the
    prompt causal, each row over the prompt's keys and its own (qkv [N, 3 W] -> y [N, W])."""
    width = qkv.shape[1] // 3
    length = (qkv.shape[0] - prompt) // rows
    q, k, v = qkv.split(width, dim=1)
    qp, kp, vp = (t[:prompt].view(1, prompt, heads, -1).transpose(1, 2) for t in (q, k, v))
    qb, kb, vb = (t[prompt:].view(rows, length, heads, -1).transpose(1, 2) for t in (q, k, v))
    yp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)
    kb = torch.cat([kp.expand(rows, -1, -1, -1), kb], dim=2)
    vb = torch.cat([vp.expand(rows, -1, -1, -1), vb], dim=2)
    steps = torch.arange(prompt + length)
    mask = (steps[prompt:, None] >= steps[None, :])[None, None]
    yb = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
    return torch.cat(
        [yp.transpose(1, 2).reshape(prompt, -1), yb.transpose(1, 2).reshape(-1, width)]
    )


@settings(max_examples=40, deadline=None)
@given(
    prompt=st.integers(1, 9),
    rows=st.integers(1, 12),
    length=st.integers(1, 10),
    heads=st.integers(1, 4),
    dim=st.integers(1, 17),
    spread=st.sampled_from([0.1, 1.0, 3.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_values_and_gradients_equal_torchs_attention(
    prompt, rows, length, heads, dim, spread, seed
) -> None:
    generator = torch.Generator().manual_seed(seed)
    tokens = prompt + rows * length
    qkv = spread * torch.randn(tokens, 3 * heads * dim, generator=generator)
    grad = torch.randn(tokens, heads * dim, generator=generator)
    scale = dim**-0.5
    leaf = qkv.clone().requires_grad_()
    mine = prompt_attention(leaf.t().contiguous(), prompt, rows, heads, scale).t()
    (mine_grad,) = torch.autograd.grad(mine, leaf, grad)
    exact = qkv.double().requires_grad_()
    want = _sdpa(exact, prompt, rows, heads, scale)
    (want_grad,) = torch.autograd.grad(want, exact, grad.double())
    # float32 rounding of sums of up to prompt + length terms of the inputs' size
    size = 1 + spread * spread * dim**0.5
    torch.testing.assert_close(mine.double(), want, rtol=0, atol=2e-6 * size)
    torch.testing.assert_close(mine_grad.double(), want_grad, rtol=0, atol=1e-5 * size * size)


def test_a_far_lower_score_takes_no_weight() -> None:
    """A seen key whose score lies far below the query's best (beyond exp(-50)) takes weight
    within 2e-22 of 0, as softmax gives it; a masked key exactly 0."""
    heads, prompt = 1, 2
    # tokens: prompt (2) then one row of 2; q = 1 everywhere; keys 0 and 200 (scaled by 1)
    q = torch.ones(4)
    k = torch.tensor([0.0, 200.0, 0.0, 0.0])
    v = torch.tensor([5.0, 7.0, 11.0, 13.0])
    qkv = torch.stack([q, k, v])  # [3 W, N] with W = 1
    y = prompt_attention(qkv, prompt, 1, heads, 1.0)
    # token 0 sees key 0 only; token 1 sees keys 0 and 1 (1 dominates); the row's tokens see
    # the prompt's keys (key 1 dominates) and their own (score 0)
    assert y[0, 0].item() == 5.0
    assert y[0, 1:].tolist() == pytest.approx([7.0, 7.0, 7.0], abs=1e-5)


def test_token_positions() -> None:
    assert token_positions(2, 3, 2).tolist() == [-1, -1, 0, 1, 0, 1, 0, 1]


def test_it_refuses_what_it_does_not_compute() -> None:
    with pytest.raises(ValueError, match="float32 CPU"):
        prompt_attention(torch.zeros(6, 5, dtype=torch.float64), 1, 2, 1, 1.0)
    with pytest.raises(ValueError, match="rows of one length"):
        prompt_attention(torch.zeros(6, 6), 1, 2, 1, 1.0)


def test_the_rescoring_takes_it_with_gradients_and_computes_the_models_own(monkeypatch) -> None:
    """``shared_prompt_logits`` with gradients on a CPU runs its attention by ``prompt_attention``
    (without gradients, by SDPA): the logits and parameter gradients of transformers' own forward
    of each row's prompt and tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=13, n_positions=32, n_embd=24, n_layer=2, n_head=3,
        activation_function="gelu_pytorch_tanh", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    calls = []
    original = lean_gpt2.prompt_attention
    monkeypatch.setattr(
        lean_gpt2, "prompt_attention", lambda *a: calls.append(a[1:]) or original(*a)
    )
    body = torch.randint(0, 13, (6, 5))
    weights = torch.randn(6, 6, 13)
    prompt = torch.tensor([1, 2, 3])
    results = []
    for lean in (True, False):
        model.zero_grad()
        if lean:
            logits = lean_gpt2.shared_prompt_logits(model, prompt.tolist(), body)
        else:  # the reference: each row alone through the model's forward
            logits = torch.stack(
                [model(input_ids=torch.cat([prompt, row])[None]).logits[0, 2:] for row in body]
            )
        (logits * weights).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    assert calls == [(3, 6, 3, (24 // 3) ** -0.5)] * 2  # two blocks, in the lean forward only
    (got, grads), (want, grads_ref) = results
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for mine, ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-5 * (1 + ref.abs().max().item()))
    with torch.no_grad():
        lean_gpt2.shared_prompt_logits(model, [1, 2, 3], body)
    assert len(calls) == 2
