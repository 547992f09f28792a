"""The rollout's own columns only (``record=False``, ``shared_prompts.column_head``): a training
rollout draws from its legal tokens and the stop and reads no log-probability, so for a model
whose head may be applied alone its decoding forwards compute those columns of the head only.

- ``column_head`` gives the model's own logits at those columns, within float32 rounding, on random
  Llama-, Qwen2- and GPT-2-shaped models with LoRA adapters, for any columns (Hypothesis); none for
  a head with an adapter of its own, nor for a model whose logits are more than its head's;
- a rollout without a record draws the rows of the same rollout with one (per-row prompts and
  temperatures, with and without a grammar; one lane, two lanes as threads, two as processes),
  records no log-probabilities, and applies the whole head once only (its prompts' state 0),
  where the recorded rollout applies it at every token.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from peft import LoraConfig, get_peft_model

from raptb.adapters.lm import shared_prompts
from raptb.adapters.lm.lane_process import can_fork
from raptb.adapters.lm.lanes import Lanes
from tests.adapters.test_shared_prompts import MODELS, SHAPES, VOCAB
from tests.adapters.test_static_decode import GRAMMAR, llama_lora_policy

PROMPTS = ["Make 24:", "", "24 from 1 2 3 4, please:", "1+1"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=10, deadline=None)
@given(
    columns=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=VOCAB, unique=True),
    rows=st.integers(1, 4),
    width=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_the_column_head_is_the_models_logits_at_those_columns(
    shape: str, columns: list[int], rows: int, width: int, seed: int
) -> None:
    model = MODELS[shape].eval()
    ids = torch.randint(0, VOCAB, (rows, width), generator=torch.Generator().manual_seed(seed))
    picked = torch.tensor(columns)
    head = shared_prompts.column_head(model, picked)
    assert head is not None
    with torch.no_grad():
        want = model(input_ids=ids).logits[..., picked]
        hidden = shared_prompts.decoder_of(model)(input_ids=ids).last_hidden_state
        got = head(hidden)
    assert got.shape == (rows, width, len(columns))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_no_column_head_for_an_adapted_head_or_other_logits() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapted = get_peft_model(
            SHAPES["llama"](), LoraConfig(r=2, target_modules=["q_proj", "lm_head"])
        )
    columns = torch.tensor([1, 2])
    assert shared_prompts.column_head(adapted, columns) is None  # the adapter changes the head
    gemma = type("Gemma2ForCausalLM", (torch.nn.Module,), {})()  # soft-capped logits
    assert shared_prompts.column_head(gemma, columns) is None
    assert shared_prompts.column_head(MODELS["qwen2"], columns) is not None


def _rollouts(policy, lanes: Lanes, seed: int):
    """The same rollout recorded and not, with the whole head's calls of each counted."""
    policy.lanes = lanes
    n = 9
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    head = policy.model.get_output_embeddings()
    out = {}
    for record in (True, False):
        calls = []
        hook = head.register_forward_hook(lambda *_, seen=calls: seen.append(1))
        try:
            rollout = policy.sample(
                prompts,
                n,
                min_length=1,
                max_length=8,
                temperature=torch.linspace(0.6, 1.6, n),
                generator=torch.Generator().manual_seed(seed),
                record=record,
            )
        finally:
            hook.remove()
        out[record] = rollout, len(calls)
    return out


@pytest.mark.parametrize("grammar", [None, GRAMMAR], ids=["free", "grammar"])
@pytest.mark.parametrize("lanes", ["one", "threads", "processes"])
def test_a_rollout_without_a_record_draws_the_same_rows(grammar, lanes) -> None:
    if lanes == "processes" and not can_fork():
        pytest.skip("lanes in processes need fork (Linux)")
    policy = llama_lora_policy(grammar)
    assert shared_prompts.head_only(policy.model)
    count = {"one": Lanes(1), "threads": Lanes(2), "processes": Lanes(2, processes=True)}[lanes]
    try:
        for seed in (0, 1):
            out = _rollouts(policy, count, seed)
            (recorded, whole), (bare, once) = out[True], out[False]
            assert torch.equal(bare.tokens, recorded.tokens)
            assert torch.equal(bare.length, recorded.length)
            assert bare.texts == recorded.texts and bare.rows == recorded.rows
            assert bare.log_pf is None and bare.log_pterm is None
            assert recorded.log_pf is not None and len(set(recorded.texts)) > 1
            # the whole head: the prompts' state 0 only, not each token's (in this process)
            assert once == 1
            assert whole > 1
            if lanes == "one":  # state 0, then a forward after each column but the last
                assert whole == 1 + int(recorded.length.max())
    finally:
        count.close()
