"""The rollout's bookkeeping is result-neutral: fixed-seed rollouts equal, bit for bit, those of a
plain reference loop kept here (the rollout as first written: separate grammar masks, one host round
trip per query, boolean-mask writes; its prompt forwarded once for all rows). Tokens, lengths, texts
and both log-prob tensors must match exactly, and so must the generator state afterwards (the same
random draws were taken). This holds the eager path (torch's operations, as the reference's); the
compiled path is held to the same reference, up to float rounding, in test_compiled_rollout.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import Rollout, row_temperatures, token_log_probs
from tests.adapters.test_policy import GRAMMAR, PROMPT, make_policy


@torch.no_grad()
def reference_rollout(
    policy: HFPolicy,
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [n, T], length [n], log_pf [n, T], log_pterm [n, T+1]) by the reference loop."""
    temp = row_temperatures(temperature, n)
    prompt_ids = policy.prompt_ids(PROMPT)
    big_t, num_legal = max_length, len(policy.legal_ids)
    legal = torch.tensor(policy.legal_ids, dtype=torch.long)
    tokens = torch.full((n, big_t), policy.pad_id, dtype=torch.long)
    length = torch.full((n,), big_t, dtype=torch.long)
    log_pf = torch.zeros(n, big_t)
    log_pterm = torch.zeros(n, big_t + 1)
    active = torch.ones(n, dtype=torch.bool)
    grammar = policy.grammar_batch(n)
    if grammar is not None:
        grammar.reset()
    policy.model.eval()
    attention = torch.ones(n, len(prompt_ids) + big_t, dtype=torch.long)
    # the prompt forwarded once for every row, its keys and values broadcast to the n rows; its
    # logits at its last position only, as shared_prompts computes them (lean_gpt2 computes them
    # at every position, which rounds the last one's otherwise in the last bit)
    keep = 0 if policy.uses_lean_gpt2(policy.model) else 1
    once = policy.model(input_ids=torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=keep)
    cache = DynamicCache()
    for i, layer in enumerate(once.past_key_values.layers):
        cache.update(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1), i)
    out = SimpleNamespace(logits=once.logits.expand(n, -1, -1), past_key_values=cache)
    for k in range(big_t + 1):
        logits = out.logits[:, -1, :]
        if k == big_t:
            _, stop_lp = token_log_probs(
                logits, torch.full_like(length, policy.stop_id), policy.stop_id
            )
            log_pterm[:, k] = torch.where(active, stop_lp, 0.0)
            break
        if grammar is None:
            allowed = torch.ones(n, num_legal, dtype=torch.bool)
            complete = torch.ones(n, dtype=torch.bool)
        else:
            allowed = grammar.allowed_mask().clone()
            complete = grammar.stop_mask().clone()
        can_stop = complete & (k >= min_length)
        can_stop |= ~allowed.any(dim=1)
        allowed &= active[:, None]
        can_stop |= ~active
        sub_mask = torch.cat([allowed, can_stop[:, None]], dim=1)
        sub_logits = torch.cat([logits[:, legal], logits[:, [policy.stop_id]]], dim=1)
        behaviour = sub_logits.float() / temp[:, None]
        behaviour = behaviour.masked_fill(~sub_mask, float("-inf"))
        choice = torch.multinomial(torch.softmax(behaviour, dim=1), 1, generator=generator).squeeze(
            1
        )
        stops = active & (choice == num_legal)
        moves = active & ~stops
        step_tokens = torch.where(moves, legal[choice.clamp(max=num_legal - 1)], policy.pad_id)
        token_lp, stop_lp = token_log_probs(logits, step_tokens, policy.stop_id)
        log_pterm[:, k] = torch.where(active, stop_lp, 0.0)
        log_pf[:, k] = torch.where(moves, token_lp, 0.0)
        tokens[:, k] = step_tokens
        length[stops] = k
        active = moves
        if not bool(active.any()):
            break
        if grammar is not None:
            for row in torch.nonzero(moves).squeeze(1).tolist():
                assert grammar.accept(row, int(step_tokens[row]))
        out = policy.model(
            input_ids=step_tokens[:, None],
            attention_mask=attention[:, : len(prompt_ids) + k + 1],
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return tokens, length, log_pf, log_pterm


def assert_identical(policy: HFPolicy, r: Rollout, ref: tuple[torch.Tensor, ...]) -> None:
    tokens, length, log_pf, log_pterm = ref
    assert torch.equal(r.tokens, tokens)
    assert torch.equal(r.length, length)
    # bitwise, not allclose: the same float32 values, not merely close ones
    assert torch.equal(r.log_pf.view(torch.int32), log_pf.view(torch.int32))
    assert torch.equal(r.log_pterm.view(torch.int32), log_pterm.view(torch.int32))
    rows = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    assert r.rows == rows
    assert r.texts == [policy.row_text(row) for row in rows]


@pytest.fixture(scope="module", params=["grammar", "free", "lora"])
def sharp_policy(request: pytest.FixtureRequest) -> HFPolicy:
    # sharpened logits so that rows stop at different steps and some stop early
    policy = make_policy(None if request.param == "free" else GRAMMAR, seed=3, logit_scale=4.0)
    policy.decode = "eager"  # (torch's kernels, as the reference's: bit for bit)
    if request.param == "lora":
        policy.model = apply_lora(policy.model, rank=4, dropout=0.0)
    return policy


ROLLOUT_CASES = (
    ("seed", "n", "min_length", "max_length", "temperature"),
    [
        (0, 16, 3, 9, 1.0),
        (1, 7, 0, 5, 0.5),
        (2, 32, 1, 12, 2.0),
        (3, 1, 0, 1, 1.0),
        (5, 6, 0, 30, 1.0),
        (4, 9, 2, 6, torch.linspace(0.3, 3.0, 9)),
        (6, 5, 0, 0, 1.0),
    ],
)
"""Rollouts held to the reference loop (here and in test_compiled_rollout.py): row counts from 1 to
32, no minimum to a minimum of 3, horizons from 0 to past the grammar's longest expression (seed
5: every row stops early), temperatures below and above 1 and one per row."""


@pytest.mark.parametrize(*ROLLOUT_CASES)
def test_rollout_equals_reference_loop(
    sharp_policy: HFPolicy,
    seed: int,
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
) -> None:
    fast_gen = torch.Generator().manual_seed(seed)
    ref_gen = torch.Generator().manual_seed(seed)
    r = sharp_policy.sample(
        PROMPT,
        n,
        min_length=min_length,
        max_length=max_length,
        temperature=temperature,
        generator=fast_gen,
    )
    ref = reference_rollout(sharp_policy, n, min_length, max_length, temperature, ref_gen)
    assert_identical(sharp_policy, r, ref)
    assert torch.equal(fast_gen.get_state(), ref_gen.get_state())
    if sharp_policy.grammar is not None and seed == 5:
        # this case is here for the loop's early exit: every row stops before max_length
        assert int(r.length.max()) < max_length
