"""``shared_prompts``: each distinct prompt forwarded once, its keys and values given to its rows,
the head applied only where a log-probability is read. Held to the model's own forward over every
row's ``cat([prompt, body])`` (``adapters.lm.rescoring.model_logits``, the reference):
the same log-probabilities at every state a row reads and the same LoRA gradients, up to float32
rounding, on random Llama-, Qwen2- and GPT-2-shaped models with random LoRA adapters, for rows
that share one prompt, come in groups or each have their own (Hypothesis); through ``HFPolicy``
the rescoring and the reference pass against each row's own forward (``reference_scores``); the
eager rollout's shared prefill against the prefill of every row (a sharded model's; the same
rows)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from raptb.adapters.lm import shared_prompts
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.rollout_record import token_log_probs
from raptb.adapters.lm.row_prompts import left_padded, row_prompt_ids
from tests.adapters.reference_scores import assert_grads_close, reference_scores
from tests.adapters.test_one_path import with_lora
from tests.adapters.test_policy import PROMPT, gen, make_policy

VOCAB, STOP, PAD = 40, 2, 0
GROUPED = {  # Llama's and Qwen2's fields: 2 layers, width 32, grouped KV heads
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
NO_DROPOUT = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
SHAPES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**GROUPED, tie_word_embeddings=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**GROUPED)),
    "gpt2": lambda: GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, **NO_DROPOUT)
    ),
}


def lora_model(shape: str) -> torch.nn.Module:
    """A random model of ``shape`` with random (nonzero) LoRA adapters, no dropout."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = apply_lora(SHAPES[shape](), rank=4, dropout=0.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    return model


MODELS = {shape: lora_model(shape) for shape in SHAPES}


def slow_log_probs(
    model: torch.nn.Module,
    rows: list[list[int]],
    body: torch.Tensor,
    length: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: ``rescoring.model_logits``' forward of every row's prompt and body (left-
    padded), log-probs of the next token and of the stop at each state, 0 after a row's stop."""
    ids, mask, positions = left_padded(rows, PAD, body.device)
    big_t, width = body.shape[1], ids.shape[1]
    after = positions[:, -1:] + 1 + torch.arange(big_t)[None, :]
    logits = model(
        input_ids=torch.cat([ids, body], dim=1),
        attention_mask=torch.cat([mask, torch.ones_like(body)], dim=1),
        position_ids=torch.cat([positions, after], dim=1),
        use_cache=False,
    ).logits[:, width - 1 :]
    following = torch.cat([body, torch.full((len(rows), 1), STOP)], dim=1)
    token_lp, stop_lp = token_log_probs(logits, following, STOP, temperature)
    read = torch.arange(big_t + 1)[None, :] <= length[:, None]
    return torch.where(read, token_lp, 0.0), torch.where(read, stop_lp, 0.0)


def values_and_grads(fn, model, weights) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    token_lp, stop_lp = fn()
    (token_lp * weights[0] + stop_lp * weights[1]).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return token_lp.detach(), stop_lp.detach(), grads


@st.composite
def batches(draw):
    prompts = draw(
        st.lists(
            st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=5), min_size=1, max_size=3
        )
    )
    b = draw(st.integers(1, 5))
    rows = [prompts[draw(st.integers(0, len(prompts) - 1))] for _ in range(b)]
    big_t = draw(st.integers(0, 6))
    body = draw(st.lists(st.integers(3, VOCAB - 1), min_size=b * big_t, max_size=b * big_t))
    length = draw(st.lists(st.integers(0, big_t), min_size=b, max_size=b))
    seed = draw(st.integers(0, 2**16))
    return rows, torch.tensor(body, dtype=torch.long).reshape(b, big_t), torch.tensor(length), seed


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=15, deadline=None)
@given(batch=batches(), temperature=st.sampled_from([1.0, 0.7]))
def test_equals_the_forward_of_every_row(shape, batch, temperature) -> None:
    rows, body, length, seed = batch
    model = MODELS[shape]
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(2, len(rows), body.shape[1] + 1, generator=g)
    want = values_and_grads(
        lambda: slow_log_probs(model, rows, body, length, temperature), model, weights
    )
    got = values_and_grads(
        lambda: shared_prompts.read_log_probs(model, rows, body, length, PAD, STOP, temperature),
        model,
        weights,
    )
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=1e-5)
    # each gradient within 2e-5 of its largest entry: float32 sums over the rows reordered
    assert_grads_close(got[2], want[2])


def test_head_only_where_the_logits_are_plain() -> None:
    assert all(shared_prompts.head_only(model) for model in MODELS.values())
    gemma = type("Gemma2ForCausalLM", (torch.nn.Module,), {})()
    assert not shared_prompts.head_only(gemma)


def test_each_distinct_prompt_is_forwarded_once() -> None:
    model = MODELS["llama"]
    decoder = model.get_base_model().get_decoder()
    seen: list[tuple[int, ...]] = []
    hook = decoder.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        rows = [[5, 6, 7], [8, 9], [5, 6, 7], [8, 9], [5, 6, 7]]
        body = torch.randint(3, VOCAB, (5, 4))
        shared_prompts.read_log_probs(model, rows, body, torch.tensor([4, 1, 2, 0, 3]), PAD, STOP)
    finally:
        hook.remove()
    # the two prompts once (left-padded to 3), then the five bodies up to the longest row (4)
    assert seen == [(2, 3), (5, 4)]


@pytest.fixture(scope="module")
def lora_policy():
    policy = with_lora(make_policy(seed=3, logit_scale=4.0))
    assert not policy.uses_lean_gpt2(policy.model)  # transformers' forward: the path under test
    return policy


def policy_scores(policy, prompts, tokens, length):
    policy.model.zero_grad(set_to_none=True)
    log_pf, log_pterm = policy.score(prompts, tokens, length)
    (log_pf.sum() + 0.5 * log_pterm.sum()).backward()
    grads = [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]
    ref = policy.reference_score(prompts, tokens, length)
    return log_pf.detach(), log_pterm.detach(), grads, ref


def reference_policy_scores(policy, prompts, tokens, length):
    """``policy_scores`` by the reference: each row's own forward of its prompt and tokens."""
    rows = row_prompt_ids(policy.prompt_ids, prompts, tokens.shape[0])
    model = policy.model
    model.zero_grad(set_to_none=True)
    log_pf, log_pterm = reference_scores(model, rows, tokens, length, policy.stop_id)
    (log_pf.sum() + 0.5 * log_pterm.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    with torch.no_grad(), model.disable_adapter():
        ref = reference_scores(model, rows, tokens, length, policy.stop_id)
    return log_pf.detach(), log_pterm.detach(), grads, ref


@pytest.mark.parametrize("mixed", [False, True])
def test_policy_rescoring_and_reference_pass(lora_policy, mixed: bool) -> None:
    policy = lora_policy
    n = 6
    prompts = [PROMPT, "", PROMPT, "24:", "", PROMPT] if mixed else PROMPT
    r = policy.sample(prompts, n, min_length=0, max_length=7, generator=gen(1))
    got = policy_scores(policy, prompts, r.tokens, r.length)
    want = reference_policy_scores(policy, prompts, r.tokens, r.length)
    for mine, ref in zip(got[:2] + got[3], want[:2] + want[3], strict=True):
        torch.testing.assert_close(mine, ref, atol=2e-5, rtol=1e-5)
    assert_grads_close(got[2], want[2])
    # and the rollout's own log-probs are the rescoring's
    torch.testing.assert_close(got[0], r.log_pf, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], r.log_pterm, atol=2e-5, rtol=1e-5)


def test_rollout_prefill_shared_equals_every_row(lora_policy, monkeypatch) -> None:
    """The eager rollout's prefill of each distinct prompt once (one process) and of every row's
    (a model sharded across processes, ``step_together`` set: its forwards enter at its root):
    the same rows, the same log-probs."""
    policy = lora_policy
    prompts = [PROMPT, "", PROMPT, "24:", "", PROMPT, "24:"]
    on = policy.sample(prompts, 7, min_length=1, max_length=8, generator=gen(4))
    monkeypatch.setattr(policy, "step_together", lambda done: done)
    off = policy.sample(prompts, 7, min_length=1, max_length=8, generator=gen(4))
    assert torch.equal(on.tokens, off.tokens) and torch.equal(on.length, off.length)
    torch.testing.assert_close(on.log_pf, off.log_pf, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(on.log_pterm, off.log_pterm, atol=2e-5, rtol=1e-5)
