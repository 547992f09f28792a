"""The compiled rescoring (adapters/lm/embedded/compiled_rescoring.py) and its exponential
(adapters/lm/embedded/vector_exp.py), held to independent references on random inputs.

The rescoring's log-probabilities and every parameter's gradient are held to transformers' own
``GPT2LMHeadModel`` forward in float64, one row at a time (prompt then tokens, no shared pass, no
lean forward), then the log-softmax, differentiated by torch's autograd: random model shapes (1-2
blocks, 1-3 heads, every activation the module computes, the head tied or not), every parameter
moved off its initialisation, random prompts, rows, tokens and temperatures. Through the policy,
tests/adapters/test_one_path.py holds it to the same reference.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

from raptb.adapters.lm.embedded import compiled_rescoring, lean_gpt2
from raptb.adapters.lm.embedded.vector_exp import HIGHEST, LOWEST, exp_into

ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu")


def random_model(seed: int, layers: int, heads: int, dim: int, vocab: int, act: str, tied: bool):
    """A GPT-2 of the given shape with every parameter moved off its initialisation."""
    config = GPT2Config(
        vocab_size=vocab, n_positions=32, n_embd=heads * dim, n_layer=layers, n_head=heads,
        n_inner=3 * heads * dim, activation_function=act, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def reference(model, prompt: list[int], body: torch.Tensor, stop: int, temperature: float):
    """(token_lp, stop_lp) [B, T + 1] by the model's own forward, a row at a time."""
    outs = []
    for row in body:
        ids = torch.tensor(prompt + row.tolist())[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 :]
        log_p = torch.log_softmax(logits / temperature, dim=-1)  # in the model's dtype
        following = torch.cat([row, torch.tensor([stop])])
        outs.append((log_p.gather(-1, following[:, None])[:, 0], log_p[:, stop]))
    return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


def values_and_grads(model, path, weight: torch.Tensor):
    """The log-probabilities [2, B, T + 1] of ``path`` and each parameter's gradient of
    sum(weight * log-probabilities)."""
    model.zero_grad(set_to_none=True)
    both = torch.stack(path())
    (both * weight).sum().backward()
    return both.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    layers=st.integers(1, 2),
    heads=st.integers(1, 3),
    dim=st.integers(4, 8),  # width >= 4: a layer norm over 2 features is ill-conditioned
    vocab=st.integers(3, 20),
    act=st.sampled_from(ACTIVATIONS),
    tied=st.booleans(),
    prompt_len=st.integers(1, 5),
    rows=st.integers(1, 6),
    width=st.integers(1, 6),
    temperature=st.sampled_from([1.0, 0.7, 1.6]),
)
def test_values_and_gradients_equal_transformers_forward(
    seed, layers, heads, dim, vocab, act, tied, prompt_len, rows, width, temperature
) -> None:
    model = random_model(seed, layers, heads, dim, vocab, act, tied)
    assert lean_gpt2.supports(model) and compiled_rescoring.computes(model)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, size=prompt_len).tolist()
    body = torch.from_numpy(rng.integers(0, vocab, size=(rows, width)))
    stop = int(rng.integers(0, vocab))
    following = torch.cat([body, torch.full_like(body[:, :1], stop)], dim=1)
    weight = torch.from_numpy(rng.standard_normal((2, rows, width + 1)).astype(np.float32))
    exact = copy.deepcopy(model).double()  # the reference in float64: only our rounding is left
    ref, ref_grads = values_and_grads(
        exact, lambda: reference(exact, prompt, body, stop, temperature), weight.double()
    )
    got, grads = values_and_grads(
        model,
        lambda: compiled_rescoring.log_probs(model, prompt, body, following, stop, temperature),
        weight,
    )
    got, ref = got.double(), ref
    assert torch.allclose(got, ref, rtol=0, atol=2e-5 * max(1.0, float(ref.abs().max())))
    # against the largest gradient entry: a parameter's own can cancel to well below the rest
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    for name, expected in ref_grads.items():
        assert torch.allclose(grads[name].double(), expected, rtol=0, atol=5e-5 * scale), name


def test_two_forwards_before_their_backwards_keep_their_own_activations() -> None:
    """Each forward holds its workspace until its backward: a second forward in between (another
    micro-batch, a reference pass) does not overwrite the first's activations; a forward without
    gradients gives its workspace back at once."""
    model = random_model(5, 2, 2, 4, 12, "gelu_new", True)
    rng = np.random.default_rng(5)
    prompt = [1, 2, 3]
    bodies = [torch.from_numpy(rng.integers(0, 12, size=(4, 5))) for _ in range(2)]
    following = [torch.cat([b, torch.full_like(b[:, :1], 0)], dim=1) for b in bodies]

    def loss(i: int) -> torch.Tensor:
        token_lp, stop_lp = compiled_rescoring.log_probs(model, prompt, bodies[i], following[i], 0)
        return token_lp.sum() + 0.5 * stop_lp.sum()

    expected = []
    for i in range(2):
        model.zero_grad(set_to_none=True)
        loss(i).backward()
        expected.append(model.transformer.h[0].mlp.c_fc.weight.grad.clone())
    model.zero_grad(set_to_none=True)
    first, second = loss(0), loss(1)
    with torch.no_grad():
        loss(1)
    first.backward()
    got_first = model.transformer.h[0].mlp.c_fc.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    second.backward()
    got_second = model.transformer.h[0].mlp.c_fc.weight.grad
    assert torch.allclose(got_first, expected[0], rtol=0, atol=1e-6)
    assert torch.allclose(got_second, expected[1], rtol=0, atol=1e-6)
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)


def test_models_it_does_not_compute_are_left_to_torch() -> None:
    model = random_model(1, 1, 1, 4, 6, "gelu_new", True)
    assert compiled_rescoring.computes(model)
    model.config.activation_function = "tanh"
    assert not compiled_rescoring.computes(model)
    assert not compiled_rescoring.computes(random_model(1, 1, 1, 4, 6, "gelu", True).double())


@settings(max_examples=200, deadline=None)
@given(st.floats(float(LOWEST), float(HIGHEST), width=32))
def test_exp32_is_within_one_ulp_of_exp(x: float) -> None:
    got = np.empty(1, np.float32)
    exp_into(np.array([x], np.float32), got)
    exact = np.exp(np.float64(np.float32(x)))
    assert abs(float(got[0]) - exact) <= 1.0 * float(np.spacing(np.float32(exact)))


def test_exp32_on_a_dense_grid_and_outside_its_range() -> None:
    """Within 1 ulp at 100,001 points across the range; clamped, finite and positive beyond."""
    xs = np.linspace(LOWEST, HIGHEST, 100_001).astype(np.float32)
    got = np.empty_like(xs)
    exp_into(xs, got)
    exact = np.exp(xs.astype(np.float64))
    ulps = np.abs(got - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0
    far = np.array([-1e30, -200.0, 200.0, 1e30], np.float32)
    out = np.empty_like(far)
    exp_into(far, out)
    assert out[0] == out[1] == pytest.approx(1.1754944e-38, rel=1e-5)
    assert np.isfinite(out).all() and out[2] == out[3] > 1e38


def test_a_runs_thread_count_reaches_the_blas_that_compiled_code_calls() -> None:
    """``use_threads`` limits the OpenBLAS that Numba's ``np.dot`` calls (SciPy's), not only
    torch: left alone it starts a thread per core and keeps it spinning."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from raptb.adapters.lm.threads import use_threads

    before = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):
        use_threads(1)
        try:
            blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
            assert blas and all(pool["num_threads"] == 1 for pool in blas)
            assert torch.get_num_threads() == 1
        finally:
            torch.set_num_threads(before)
