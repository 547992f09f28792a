"""LoRA's dropout with a NumPy mask on a CPU (adapters.lm.cpu_dropout): nn.Dropout's function in
distribution (the kept share within binomial error, kept entries scaled by 1 / (1 - p), the
gradient the mask), a fresh mask every call that follows torch's seed, identity in evaluation,
and every LoRA layer of a model that ``apply_lora`` wraps using it, with the adapted output's
mean over masks the output without dropout. The mask's byte-at-a-time draw (``dropped``) is the
event u < round(p * 2**24) of each entry's 24-bit integer u built from the bytes it drew, checked
entry by entry on bytes crowded around p's own (so that most entries tie)."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.cpu_dropout import BITS, FastDropout, dropped
from raptb.adapters.lm.lora import apply_lora
from tests.adapters.test_lora import _perturb_adapter, _tiny_llama


@settings(max_examples=15, deadline=None)
@given(p=st.floats(0.02, 0.95), seed=st.integers(0, 2**31 - 1))
def test_the_mask_is_bernoulli_and_scaled(p: float, seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.rand(300, 400, dtype=torch.float64) + 0.5  # no zero entries
    x.requires_grad_(True)
    out = FastDropout(p).train()(x)
    kept = out != 0
    n = kept.numel()
    share = float(kept.double().mean())
    assert abs(share - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(out[kept], x.detach()[kept] / (1 - p), rtol=1e-6, atol=0)
    out.sum().backward()  # d out / d x = the mask scaled, 0 where dropped
    expected = kept.double() / (1 - p)
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=0)


def test_masks_follow_torchs_seed_and_change_every_call() -> None:
    x = torch.ones(64, 128)
    layer = FastDropout(0.3).train()
    torch.manual_seed(7)
    first, second = layer(x), layer(x)
    torch.manual_seed(7)
    again = layer(x)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(first, second)
    torch.manual_seed(8)
    assert not torch.equal(layer(x), first)


def test_identity_where_nn_dropout_is() -> None:
    x = torch.randn(8, 16)
    assert torch.equal(FastDropout(0.5).eval()(x), x)
    assert torch.equal(FastDropout(0.0).train()(x), x)
    assert not FastDropout(1.0).train()(x).any()
    # off a CPU it is nn.Dropout's own kernel (here on the meta device: no NumPy array made)
    meta = FastDropout(0.5).train()(torch.empty(4, 4, device="meta"))
    assert meta.device.type == "meta"


def test_apply_lora_uses_it_and_keeps_the_mean() -> None:
    model = apply_lora(_tiny_llama(), rank=4, dropout=0.25)
    _perturb_adapter(model)
    dropouts = [
        layer
        for m in model.modules()
        if hasattr(m, "lora_dropout")
        for layer in m.lora_dropout.values()
    ]
    assert dropouts and all(type(d) is FastDropout and d.p == 0.25 for d in dropouts)
    # one adapted projection: base(x) + B A drop(x) s is linear in the mask, so its mean over
    # masks is the output without dropout
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(6, 32)
    with torch.no_grad():
        layer.eval()
        plain = layer(x)
        layer.train()
        torch.manual_seed(0)
        mean = sum(layer(x) for _ in range(4000)) / 4000
    assert float((mean - plain).abs().max()) < 0.05 * float(plain.abs().max())
    assert not torch.equal(layer(x), plain)  # training mode drops


class _Bytes:
    """A stand-in byte source that serves a fixed stream in order."""

    def __init__(self, stream: bytes) -> None:
        self.stream, self.used = stream, 0

    def __call__(self, k: int) -> np.ndarray:
        out = self.stream[self.used : self.used + k]
        assert len(out) == k, "drew more bytes than the stream holds"
        self.used += k
        return np.frombuffer(out, dtype=np.uint8)


@settings(max_examples=60, deadline=None)
@given(
    p=st.floats(0.0, 1.0, exclude_max=True),
    n=st.integers(1, 300),
    data=st.data(),
)
def test_dropped_is_u_below_the_threshold_byte_by_byte(
    p: float, n: int, data: st.DataObject
) -> None:
    threshold = round(p * 2**BITS)
    if threshold >= 2**BITS:
        assert dropped(_Bytes(b""), n, p).all()
        return
    digits = threshold.to_bytes(3, "big")
    near = st.sampled_from(
        sorted({max(d - 1, 0) for d in digits} | set(digits) | {min(d + 1, 255) for d in digits})
    )
    stream = bytes(data.draw(st.lists(near, min_size=3 * n, max_size=3 * n)))
    got = dropped(_Bytes(stream), n, p)
    # the reference: entry i's bytes are its first (stream[i]), then, in entry order, one from
    # each later level's share of the stream while it still ties; u < T compares them in order
    expected = np.zeros(n, dtype=bool)
    live = list(range(n))
    drawn = {i: [stream[i]] for i in range(n)}
    offset = n
    for level in range(3):
        if level:
            for j, i in enumerate(live):
                drawn[i].append(stream[offset + j])
            offset += len(live)
        still = []
        for i in live:
            if drawn[i][level] < digits[level]:
                expected[i] = True
            elif drawn[i][level] == digits[level]:
                still.append(i)
        live = still
    assert np.array_equal(got, expected)
