"""The static decoding path against the eager one: same seed, same tokens, lengths, texts and random
draws (generator state afterwards), log-probs within 1e-5; on the tiny GPT-2 model and a
LoRA-wrapped random Llama-shaped model, with Expr24's grammar and without, rows stopping at
different lengths. Per-row prompts (left-padded) against each prompt rolled out alone, and a
decoder built before an in-place weight update (as the optimizer makes) against the eager path
after it.
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from raptb.adapters.lm.decode_mode import resolve_decode
from raptb.adapters.lm.gpu.static_decoder import StaticDecoders, bucket_rows
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import Rollout
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.adapters.tasks.expr24.task import expr24_grammar
from tests.adapters.test_policy import ALPHABET, PROMPT, make_policy

torch.set_num_threads(1)

GRAMMAR = expr24_grammar(1, 9)
TOLERANCE = 1e-5


def llama_lora_policy(grammar: str | None) -> HFPolicy:
    """A random Llama-shaped model (2 layers, width 32, grouped KV heads) under LoRA r4 with
    dropout 0.1 and non-zero adapter weights, so the adapter changes every logit."""
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = apply_lora(LlamaForCausalLM(config), rank=4, dropout=0.1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.3)
            model.get_output_embeddings().weight.mul_(6.0)  # sharper: rows stop at varied lengths
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    return HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=grammar)


@pytest.fixture(scope="module", params=["tiny-grammar", "tiny-free", "llama-lora-grammar"])
def policy(request: pytest.FixtureRequest) -> HFPolicy:
    grammar = None if request.param.endswith("free") else GRAMMAR
    if request.param.startswith("llama"):
        return llama_lora_policy(grammar)
    return make_policy(grammar, seed=3, logit_scale=4.0)


def sample(
    policy: HFPolicy, decode: str, prompt: str | list[str], n: int, seed: int, **kwargs: object
) -> tuple[Rollout, torch.Tensor]:
    """A rollout on the ``decode`` path and the generator's state after it."""
    policy.decode = decode  # type: ignore[assignment]
    generator = torch.Generator().manual_seed(seed)
    rollout = policy.sample(prompt, n, generator=generator, **kwargs)  # type: ignore[arg-type]
    return rollout, generator.get_state()


def assert_same_rollout(a: Rollout, b: Rollout) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.length, b.length)
    assert a.rows == b.rows and a.texts == b.texts
    assert a.log_pf.shape == b.log_pf.shape and a.log_pterm.shape == b.log_pterm.shape
    assert torch.allclose(a.log_pf, b.log_pf, rtol=0.0, atol=TOLERANCE)
    assert torch.allclose(a.log_pterm, b.log_pterm, rtol=0.0, atol=TOLERANCE)
    # zero exactly where the layout says so: after the stop
    assert torch.equal(a.log_pf == 0, b.log_pf == 0)
    assert torch.equal(a.log_pterm == 0, b.log_pterm == 0)


@pytest.mark.parametrize(
    ("seed", "n", "min_length", "max_length", "temperature"),
    [
        (0, 16, 3, 9, 1.0),
        (1, 7, 0, 5, 0.5),
        (2, 40, 1, 12, 2.0),
        (3, 1, 0, 1, 1.0),
        (4, 9, 2, 6, torch.linspace(0.3, 3.0, 9)),
        (5, 5, 0, 0, 1.0),
    ],
)
def test_static_equals_eager(
    policy: HFPolicy,
    seed: int,
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
) -> None:
    kwargs = {"min_length": min_length, "max_length": max_length, "temperature": temperature}
    eager, eager_state = sample(policy, "eager", PROMPT, n, seed, **kwargs)
    static, static_state = sample(policy, "static", PROMPT, n, seed, **kwargs)
    assert_same_rollout(static, eager)
    assert torch.equal(static_state, eager_state)  # the same random draws were taken
    if n >= 16:
        assert len(set(eager.length.tolist())) > 1  # rows stop at different lengths


def test_rollouts_sharing_a_decoder_equal_eager() -> None:
    # n = 5 and n = 7 share the bucket of 8 rows (and its cache) with the same prompt and T
    policy = make_policy(GRAMMAR, seed=3, logit_scale=4.0)
    assert bucket_rows(5) == bucket_rows(7) == 8
    for seed, n in [(0, 7), (1, 5), (2, 7)]:
        kwargs = {"min_length": 1, "max_length": 9}
        eager, _ = sample(policy, "eager", PROMPT, n, seed, **kwargs)
        static, _ = sample(policy, "static", PROMPT, n, seed, **kwargs)
        assert_same_rollout(static, eager)
    # the CPU never takes the CUDA-graph code, however often a decoder is used
    (decoder,) = policy.decoders._decoders.values()
    assert decoder.rollouts == 3 and decoder.graphs is None and decoder.moved_ready is None
    assert not decoder.wants_capture()


def test_cuda_schedule_and_a_failed_capture_equal_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the CUDA schedule run on the CPU: a decoder marked as CUDA replays the forward before it
    # reads the drawn tokens and, at its second rollout, warms up (spoiling the rollout's state)
    # and tries to capture; CUDAGraph cannot be built here, as a capture can fail on a GPU, and
    # the rollout must start again clean and equal the eager one
    policy = make_policy(GRAMMAR, seed=3, logit_scale=4.0)
    kwargs = {"min_length": 1, "max_length": 9}
    sample(policy, "static", PROMPT, 8, 0, **kwargs)
    (decoder,) = policy.decoders._decoders.values()
    decoder.cuda = True
    side = SimpleNamespace(wait_stream=lambda stream: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: side)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    with caplog.at_level(logging.WARNING, logger="raptb.adapters.lm.gpu.static_decode"):
        for seed in (1, 2):
            eager, eager_state = sample(policy, "eager", PROMPT, 8, seed, **kwargs)
            static, static_state = sample(policy, "static", PROMPT, 8, seed, **kwargs)
            assert_same_rollout(static, eager)
            assert torch.equal(static_state, eager_state)
    assert decoder.graphs_failed and decoder.graphs is None
    assert caplog.text.count("CUDA graph capture failed") == 1  # tried once, not retried


def test_static_sees_weights_updated_in_place() -> None:
    policy = llama_lora_policy(GRAMMAR)
    kwargs = {"min_length": 1, "max_length": 9}
    before, _ = sample(policy, "static", PROMPT, 12, 0, **kwargs)  # builds the decoder
    # what an optimizer step does: the adapter tensors change in place (seeded, so the test does
    # not depend on the global generator that earlier tests leave behind; a scale of 0.05 moves
    # the log-probs by far more than the tolerance without inflating the logits' rounding)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in policy.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=noise), alpha=0.05)
    eager, _ = sample(policy, "eager", PROMPT, 12, 0, **kwargs)
    static, _ = sample(policy, "static", PROMPT, 12, 0, **kwargs)
    assert len(policy.decoders._decoders) == 1  # the same decoder, not a rebuilt one
    assert_same_rollout(static, eager)
    assert not torch.allclose(before.log_pterm, static.log_pterm, atol=1e-3)
    # weights in new storage (a CUDA graph would still read the old): the decoders are rebuilt
    built = next(iter(policy.decoders._decoders.values()))
    first = next(policy.model.parameters())
    first.data = first.data.clone()
    again, _ = sample(policy, "static", PROMPT, 12, 0, **kwargs)
    assert_same_rollout(again, static)
    assert [d is built for d in policy.decoders._decoders.values()] == [False]


@pytest.mark.parametrize(("model", "seed"), [("tiny", 0), ("tiny", 1), ("llama-lora", 2)])
def test_per_row_prompts_static_equals_eager(model: str, seed: int) -> None:
    """Rows of different prompts (left-padded in both paths) at per-row temperatures: the same
    seed gives the static path the eager path's draws, tokens and log-probs."""
    policy = make_policy(GRAMMAR, seed=3) if model == "tiny" else llama_lora_policy(GRAMMAR)
    prompts = ["Make 24:", "", "24 from 1 2 3 4, please:", "1+1"]
    per_row = [prompts[i % len(prompts)] for i in range(13)]
    temperature = torch.linspace(0.5, 2.0, len(per_row))
    kwargs = {"min_length": 1, "max_length": 9, "temperature": temperature}
    eager, eager_state = sample(policy, "eager", per_row, len(per_row), seed, **kwargs)
    static, static_state = sample(policy, "static", per_row, len(per_row), seed, **kwargs)
    assert_same_rollout(static, eager)
    assert torch.equal(static_state, eager_state)
    assert len(set(eager.texts)) > 1


@pytest.mark.parametrize("model", ["tiny", "llama-lora"])
def test_per_row_prompts_equal_each_prompt_alone(model: str) -> None:
    policy = make_policy(GRAMMAR, seed=3) if model == "tiny" else llama_lora_policy(GRAMMAR)
    prompts = ["Make 24:", "", "24 from 1 2 3 4, please:", "Make 24:", "1+1"]
    per_row = [p for p in prompts for _ in range(3)]
    n = len(per_row)
    # near-zero temperatures make the draws greedy, so a row's tokens do not depend on which
    # other rows share its batch; the recorded log-probs are the untempered ones all the same
    greedy = torch.full((n,), 1e-4)
    kwargs = {"min_length": 2, "max_length": 8}
    together, _ = sample(policy, "static", per_row, n, 0, temperature=greedy, **kwargs)
    assert bool(torch.isfinite(together.log_pf).all() & torch.isfinite(together.log_pterm).all())
    for i, prompt in enumerate(prompts):
        alone, _ = sample(policy, "static", prompt, 3, 0, temperature=1e-4, **kwargs)
        part = slice(3 * i, 3 * i + 3)
        assert torch.equal(together.tokens[part], alone.tokens)
        assert torch.equal(together.length[part], alone.length)
        assert torch.allclose(together.log_pf[part], alone.log_pf, rtol=0.0, atol=TOLERANCE)
        assert torch.allclose(together.log_pterm[part], alone.log_pterm, rtol=0.0, atol=TOLERANCE)
        eager, _ = sample(policy, "eager", prompt, 3, 0, temperature=1e-4, **kwargs)
        assert_same_rollout(alone, eager)
    assert len(set(together.texts)) > 1  # the prompts lead to different texts


def test_one_prompt_per_row_equals_one_shared_prompt() -> None:
    policy = make_policy(GRAMMAR, seed=3, logit_scale=4.0)
    kwargs = {"min_length": 1, "max_length": 9, "temperature": torch.linspace(0.5, 2.0, 10)}
    shared, shared_state = sample(policy, "static", PROMPT, 10, 7, **kwargs)
    listed, listed_state = sample(policy, "static", [PROMPT] * 10, 10, 7, **kwargs)
    assert_same_rollout(listed, shared)
    assert torch.equal(listed_state, shared_state)
    with pytest.raises(ValueError, match="prompt"):
        sample(policy, "static", [PROMPT] * 3, 4, 0, min_length=1, max_length=9)


def test_decode_modes_resolve() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_decode("auto", cpu, sharded=False) == "eager"
    assert resolve_decode("auto", cuda, sharded=False) == "static"
    assert resolve_decode("static", cpu, sharded=False) == "static"
    assert resolve_decode("eager", cuda, sharded=False) == "eager"
    assert resolve_decode("static", cuda, sharded=True) == "eager"
    with pytest.raises(ValueError, match="decode"):
        resolve_decode("graph", cpu, sharded=False)
    model, tokenizer = make_policy(None).model, build_char_tokenizer()
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    with pytest.raises(ValueError, match="decode"):
        HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, decode="graph")  # type: ignore[arg-type]
    assert [bucket_rows(n) for n in (1, 8, 9, 64, 65, 128, 129)] == [8, 8, 16, 64, 96, 128, 160]


def test_graph_summary_counts_captured_and_failed_decoders():
    # benchmark records read it (graphs_captured): a failed capture must not pass for a capture
    decoders = StaticDecoders()
    captured = SimpleNamespace(graphs=(object(), object()), graphs_failed=False, capture_error=None)
    failed = SimpleNamespace(graphs=None, graphs_failed=True, capture_error="RuntimeError: no")
    eager = SimpleNamespace(graphs=None, graphs_failed=False, capture_error=None)
    decoders._decoders.update({(8, 3, 4): captured, (16, 3, 4): failed, (32, 3, 4): eager})
    assert decoders.graph_summary() == {
        "decoders": 3,
        "captured": 1,
        "failed": 1,
        "error": "RuntimeError: no",
    }
