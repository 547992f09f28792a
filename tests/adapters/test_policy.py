"""HFPolicy on the tiny model: rollout invariants, masks, rescoring, reference, temperature.

References: the Expr24 language as regexes (``num (op num)*``), the model's own full-vocabulary
log-softmax computed here from a plain forward pass, and a copy of the base model.
"""

from __future__ import annotations

import copy
import os
import re

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.lm.policy import HFPolicy, default_grammar_threads, to_prefix_batch
from raptb.adapters.lm.rollout import Rollout
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.core.gfn.batch import PrefixBatch

GRAMMAR = 'root ::= num (op num)*\nnum ::= [1-9]\nop ::= "+" | "-" | "*" | "/"'
ALPHABET = "123456789+-*/"
COMPLETE = re.compile(r"[1-9]([-+*/][1-9])*")
PREFIX = re.compile(r"([1-9]([-+*/][1-9])*[-+*/]?)?")
PROMPT = "Make 24:"

torch.set_num_threads(1)


def make_policy(
    grammar: str | None = GRAMMAR, *, seed: int = 0, logit_scale: float = 1.0
) -> HFPolicy:
    model, tokenizer = load_model_and_tokenizer("tiny", seed=seed)
    if logit_scale != 1.0:
        # sharpen the (near-uniform) fresh model so temperature visibly changes the distribution
        with torch.no_grad():
            model.transformer.ln_f.weight.mul_(logit_scale)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    return HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=grammar)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def full_log_softmax(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Reference: log-softmax [len(ids), V] of a plain forward pass over one sequence, float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return make_policy()


def check_layout(policy: HFPolicy, r: Rollout, n: int, big_t: int) -> None:
    assert r.tokens.shape == (n, big_t) and r.tokens.dtype == torch.long
    assert r.length.shape == (n,) and r.length.dtype == torch.long
    assert r.log_pf.shape == (n, big_t) and r.log_pterm.shape == (n, big_t + 1)
    assert len(r.texts) == n
    cols = torch.arange(big_t)
    after_stop = cols[None, :] >= r.length[:, None]
    after_tau = torch.arange(big_t + 1)[None, :] > r.length[:, None]
    assert bool(torch.all((r.tokens == policy.pad_id) == after_stop))
    assert bool(torch.all(r.log_pf[after_stop] == 0.0))
    assert bool(torch.all(r.log_pterm[after_tau] == 0.0))
    assert bool(torch.all(r.log_pf[~after_stop] < 0.0))
    assert bool(torch.all(r.log_pterm[~after_tau] < 0.0))
    legal = set(policy.legal_ids)
    for row, tau in zip(r.tokens.tolist(), r.length.tolist(), strict=True):
        assert set(row[:tau]) <= legal


@pytest.mark.parametrize(("min_length", "max_length"), [(3, 9), (1, 1), (0, 5), (4, 7)])
def test_grammar_rollout_invariants(policy: HFPolicy, min_length: int, max_length: int) -> None:
    n = 48
    r = policy.sample(PROMPT, n, min_length=min_length, max_length=max_length, generator=gen(1))
    check_layout(policy, r, n, max_length)
    for text, tau in zip(r.texts, r.length.tolist(), strict=True):
        assert len(text) == tau  # one character per token
        assert COMPLETE.fullmatch(text), text  # stop only where the sentence is complete
        assert min_length <= tau <= max_length
    if min_length < max_length:
        assert len(set(r.length.tolist())) > 1  # not all forced stops


def test_min_and_max_length_without_grammar() -> None:
    policy = make_policy(grammar=None)
    n = 200
    r = policy.sample("", n, min_length=2, max_length=4, generator=gen(2))
    check_layout(policy, r, n, 4)
    lengths = r.length.tolist()
    assert min(lengths) == 2 and max(lengths) == 4  # stops at min length and forced stops at T
    assert all(set(t) <= set(ALPHABET) for t in r.texts)
    r0 = policy.sample("", 8, min_length=0, max_length=0, generator=gen(2))
    assert r0.tokens.shape == (8, 0) and r0.length.tolist() == [0] * 8
    assert bool(torch.all(r0.log_pterm < 0))


def test_recorded_values_are_the_full_untempered_log_softmax(policy: HFPolicy) -> None:
    r = policy.sample(PROMPT, 6, min_length=3, max_length=9, temperature=0.5, generator=gen(3))
    prompt = policy.prompt_ids(PROMPT)
    for b in range(6):
        tau = int(r.length[b])
        generated = r.tokens[b, :tau].tolist()
        ref = full_log_softmax(policy.model, prompt + generated)[len(prompt) - 1 :]
        for k in range(tau + 1):
            assert abs(float(r.log_pterm[b, k]) - float(ref[k, policy.stop_id])) < 1e-5
        for t in range(tau):
            assert abs(float(r.log_pf[b, t]) - float(ref[t, generated[t]])) < 1e-5


@pytest.mark.parametrize("prompt", ["", PROMPT])
def test_rescoring_equals_rollout(policy: HFPolicy, prompt: str) -> None:
    r = policy.sample(prompt, 32, min_length=3, max_length=9, temperature=1.5, generator=gen(4))
    log_pf, log_pterm = policy.score(prompt, r.tokens, r.length)
    assert log_pf.shape == r.log_pf.shape and log_pterm.shape == r.log_pterm.shape
    assert torch.allclose(log_pf, r.log_pf, atol=1e-5, rtol=0)
    assert torch.allclose(log_pterm, r.log_pterm, atol=1e-5, rtol=0)
    assert bool(torch.all(log_pf[r.log_pf == 0] == 0)) and bool(
        torch.all(log_pterm[r.log_pterm == 0] == 0)
    )
    # ids after the stop do not matter
    garbage = torch.where(r.log_pf == 0, 7, r.tokens)
    assert torch.equal(policy.score(prompt, garbage, r.length)[1], log_pterm)
    (log_pf.sum() + log_pterm.sum()).backward()
    grad = policy.model.transformer.h[0].attn.c_attn.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    policy.model.zero_grad(set_to_none=True)


def test_sample_restores_training_mode_and_records_no_graph(policy: HFPolicy) -> None:
    policy.model.train()
    r = policy.sample("", 4, min_length=1, max_length=3, generator=gen(5))
    assert policy.model.training
    assert not r.log_pf.requires_grad and not r.log_pterm.requires_grad


def test_reproducible_under_generator_seed(policy: HFPolicy) -> None:
    a, b, c = (
        policy.sample(PROMPT, 16, min_length=3, max_length=9, generator=gen(s)) for s in (7, 7, 8)
    )
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.log_pf, b.log_pf)
    assert torch.equal(a.log_pterm, b.log_pterm) and a.texts == b.texts
    assert not torch.equal(a.tokens, c.tokens)


def test_grammar_threads_do_not_change_rollouts(policy: HFPolicy) -> None:
    threaded = HFPolicy(
        policy.model,
        policy.tokenizer,
        legal_ids=policy.legal_ids,
        stop_id=policy.stop_id,
        grammar=policy.grammar,
        grammar_threads=2,
    )
    a = policy.sample(PROMPT, 16, min_length=3, max_length=9, generator=gen(3))
    b = threaded.sample(PROMPT, 16, min_length=3, max_length=9, generator=gen(3))
    assert torch.equal(a.tokens, b.tokens) and a.texts == b.texts
    with pytest.raises(ValueError, match="grammar_threads"):
        HFPolicy(policy.model, policy.tokenizer, legal_ids=[17], stop_id=95, grammar_threads=0)


def first_token_frequencies(policy: HFPolicy, temperature: float, n: int) -> torch.Tensor:
    r = policy.sample("", n, min_length=1, max_length=1, temperature=temperature, generator=gen(9))
    digits = [policy.tokenizer.convert_tokens_to_ids(c) for c in "123456789"]
    counts = torch.tensor([int((r.tokens[:, 0] == d).sum()) for d in digits], dtype=torch.float64)
    assert int(counts.sum()) == n  # only digits may start a sentence
    return counts / n


def test_temperature_changes_sampling_but_not_recorded_values() -> None:
    policy = make_policy(logit_scale=10.0)
    digits = [policy.tokenizer.convert_tokens_to_ids(c) for c in "123456789"]
    logits = full_log_softmax(policy.model, policy.prompt_ids(""))[-1, digits]
    n = 4000
    tv = {}
    for temperature in (1.0, 3.0):
        expected = torch.softmax(logits / temperature, dim=0)
        observed = first_token_frequencies(policy, temperature, n)
        tv[temperature] = 0.5 * float((observed - expected).abs().sum())
    assert tv[1.0] < 0.04 and tv[3.0] < 0.04
    assert 0.5 * float((torch.softmax(logits, 0) - torch.softmax(logits / 3, 0)).abs().sum()) > 0.3
    cold = policy.sample("", 64, min_length=3, max_length=9, temperature=1e-3, generator=gen(1))
    hot = policy.sample("", 64, min_length=3, max_length=9, temperature=3.0, generator=gen(1))
    assert len(set(cold.texts)) == 1 and len(set(hot.texts)) > 10
    # the first stop log-prob is the same prefix for every row and temperature
    assert bool(torch.all(cold.log_pterm[:, 0] == hot.log_pterm[0, 0]))
    for r in (cold, hot):
        log_pf, log_pterm = policy.score("", r.tokens, r.length)
        assert torch.allclose(log_pf, r.log_pf, atol=1e-5, rtol=0)
        assert torch.allclose(log_pterm, r.log_pterm, atol=1e-5, rtol=0)


def test_per_row_temperature() -> None:
    policy = make_policy(logit_scale=10.0)
    temperature = torch.tensor([1e-3] * 32 + [3.0] * 32)
    r = policy.sample("", 64, min_length=3, max_length=9, temperature=temperature, generator=gen(2))
    assert len(set(r.texts[:32])) == 1 and len(set(r.texts[32:])) > 5


def test_reference_score_frozen_copy() -> None:
    policy = make_policy(seed=5)
    r = policy.sample(PROMPT, 16, min_length=3, max_length=9, generator=gen(6))
    base = [v.detach().clone() for v in policy.score(PROMPT, r.tokens, r.length)]
    first = policy.reference_score(PROMPT, r.tokens, r.length)
    # the same weights; scored with gradients (the rescoring's own GELU and attention kernels)
    # and without (torch's), so equal up to float rounding
    for a, b in zip(first, base, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert not first[0].requires_grad
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = policy.score(PROMPT, r.tokens, r.length)
    assert not torch.allclose(moved[0], base[0], atol=1e-3)
    ref = policy.reference_score(PROMPT, r.tokens, r.length)
    assert all(torch.equal(a, b) for a, b in zip(ref, first, strict=True))  # the frozen copy


def test_reference_score_peft_disables_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = load_model_and_tokenizer("tiny", seed=2)
    base_model = copy.deepcopy(model)
    lora = LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["c_attn", "c_proj"],
        fan_in_fan_out=True,
        init_lora_weights=False,  # random B, so the adapter changes the outputs
        lora_dropout=0.0,
    )
    peft_model = get_peft_model(model, lora)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    policy = HFPolicy(peft_model, tokenizer, legal_ids=legal, stop_id=stop, grammar=GRAMMAR)
    base = HFPolicy(base_model, tokenizer, legal_ids=legal, stop_id=stop, grammar=GRAMMAR)
    r = policy.sample(PROMPT, 16, min_length=3, max_length=9, generator=gen(3))
    tuned = policy.score(PROMPT, r.tokens, r.length)
    assert torch.allclose(tuned[0], r.log_pf, atol=1e-5, rtol=0)
    expected = base.score(PROMPT, r.tokens, r.length)
    assert not torch.allclose(tuned[1], expected[1], atol=1e-3)

    def no_copy(*_: object) -> None:
        raise AssertionError("the peft path must not copy the model")

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    ref = policy.reference_score(PROMPT, r.tokens, r.length)
    for a, b in zip(ref, expected, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    # the adapter is active again afterwards
    again = policy.score(PROMPT, r.tokens, r.length)
    assert torch.allclose(again[1], tuned[1], atol=1e-6, rtol=0)


def test_prompt_ids(policy: HFPolicy) -> None:
    eos = policy.tokenizer.eos_token_id
    assert policy.prompt_ids("") == [eos]  # BOS (= EOS, as in GPT-2) starts the text
    assert policy.prompt_ids("24") == [eos, 18, 20]


def test_prompt_ids_encoded_once_per_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text is encoded once; the caller's list is its own, and the memo starts over when
    full (the same ids again)."""
    policy = make_policy(None)
    calls: list[str] = []
    encode = policy.tokenizer.encode

    def counted(text: str, **kwargs: object) -> list[int]:
        calls.append(text)
        return encode(text, **kwargs)

    monkeypatch.setattr(policy.tokenizer, "encode", counted)
    first = policy.prompt_ids("24")
    first.append(99)  # the caller's copy: the memo keeps the encoding
    assert policy.prompt_ids("24") == policy.prompt_ids("24") == first[:-1]
    assert policy.prompt_ids("1") != first[:-1]
    assert calls == ["24", "1"]
    monkeypatch.setattr("raptb.adapters.lm.policy.PROMPT_IDS_KEPT", 2)
    for text in ("2", "3", "24"):
        policy.prompt_ids(text)
    assert calls == ["24", "1", "2", "3", "24"] and policy.prompt_ids("24") == first[:-1]


def test_lean_support_asked_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``uses_lean_gpt2`` asks ``lean_gpt2.supports`` once per model, again after activation
    checkpointing is enabled (which takes the model off the lean path), and never on a sharded
    model's process."""
    from raptb.adapters.lm.embedded import lean_gpt2

    policy = make_policy(None)
    asked: list[torch.nn.Module] = []
    supports = lean_gpt2.supports
    monkeypatch.setattr(lean_gpt2, "supports", lambda m: asked.append(m) or supports(m))
    other = copy.deepcopy(policy.model)
    assert policy.uses_lean_gpt2(policy.model) and policy.uses_lean_gpt2(policy.model)
    assert policy.uses_lean_gpt2(other)
    assert asked == [policy.model, other]
    policy.sample("", 4, min_length=1, max_length=5, generator=gen(0))
    assert len(asked) == 2  # the rollout asked the memo
    policy.enable_activation_checkpointing()
    assert not policy.uses_lean_gpt2(policy.model)
    assert asked == [policy.model, other, policy.model]
    policy.step_together = lambda done: done
    assert not policy.uses_lean_gpt2(other) and len(asked) == 3


def test_to_prefix_batch(policy: HFPolicy) -> None:
    r = policy.sample("", 8, min_length=3, max_length=9, generator=gen(11))
    u = np.zeros((8, 10))
    u[:, 3] = 50.0
    batch = to_prefix_batch(r.log_pf, r.log_pterm, u, u, r.length)
    assert isinstance(batch, PrefixBatch)
    assert batch.u.dtype == torch.float32 and batch.length.dtype == torch.long
    assert float(batch.log_r[0, 3]) == 50.0


def test_bad_arguments(policy: HFPolicy) -> None:
    with pytest.raises(ValueError, match="temperature"):
        policy.sample("", 4, min_length=1, max_length=3, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        policy.sample("", 4, min_length=1, max_length=3, temperature=torch.ones(3))
    with pytest.raises(ValueError, match="min_length"):
        policy.sample("", 4, min_length=4, max_length=3)
    with pytest.raises(ValueError, match="n:"):
        policy.sample("", 0, min_length=1, max_length=3)
    with pytest.raises(ValueError, match="max_length"):
        policy.sample("", 4, min_length=1, max_length=128)  # 1 prompt token + 128 > 128 positions
    with pytest.raises(ValueError, match="length"):
        policy.score("", torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 4]))
    tok = policy.tokenizer
    with pytest.raises(ValueError, match="legal_ids"):
        HFPolicy(policy.model, tok, legal_ids=[17, 95], stop_id=95)
    with pytest.raises(ValueError, match="stop_id"):
        HFPolicy(policy.model, tok, legal_ids=[17], stop_id=1000)
    with pytest.raises(ValueError, match="grammar"):
        HFPolicy(policy.model, tok, legal_ids=[17], stop_id=95, grammar="root ::= (")


def test_default_grammar_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_grammar_threads(torch.device("cpu")) == 1
    assert default_grammar_threads(torch.device("cuda")) == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert default_grammar_threads(torch.device("cuda")) == 1
