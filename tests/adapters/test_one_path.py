"""Every rescoring path a CPU runs (adapters/lm/paths.py) against the reference: transformers' own
forward of each row's ``cat(prompt, body)`` alone (``reference_scores``). ``HFPolicy.score`` gives
the same log-probabilities and the same weight (or LoRA) gradients within float32 rounding, and
``reference_score`` the reference's values under the base weights, on random rows (Hypothesis:
copies of a row among them, rows that stop at once or run to T, one prompt or each its own):

- ``compiled_rescoring``: the embedded GPT-2, rows that share one prompt;
- ``lean_gpt2``: the embedded GPT-2, rows with their own prompts, and per-state values;
- ``shared_prompts``: a LoRA-wrapped model (any model the lean forward does not run);
- ``model``: the same as a model sharded across processes (``step_together`` set), whose forwards
  are transformers' own.

Each test checks that its path is the one that ran (``rescoring.path_of`` watched)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raptb.adapters.lm import rescoring
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.row_prompts import row_prompt_ids
from tests.adapters.reference_scores import assert_grads_close, reference_scores, weighted_grads
from tests.adapters.test_policy import make_policy

PROMPTS = ["Make 24:", "24:", "", "1+2"]


def with_lora(policy):
    """``policy`` with its model wrapped by LoRA r4 (no dropout), the B weights drawn."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy.model = apply_lora(policy.model, rank=4, dropout=0.0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return policy


@pytest.fixture(scope="module")
def policies():
    """The embedded GPT-2 (every weight trainable) and a LoRA-wrapped one (its adapters)."""
    torch.manual_seed(0)
    return {
        "embedded": make_policy(None, seed=5, logit_scale=3.0),
        "lora": with_lora(make_policy(None, seed=6, logit_scale=3.0)),
    }


@st.composite
def batches(draw, one_prompt: bool):
    """B rows of T tokens drawn from a few distinct rows (so that copies occur), their lengths,
    and one prompt or each row's own; a seed for the tokens and the gradient weights."""
    n = draw(st.integers(1, 6))
    big_t = draw(st.integers(1, 6))
    distinct = draw(st.integers(1, n))
    pick = draw(st.lists(st.integers(0, distinct - 1), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(0, big_t), min_size=distinct, max_size=distinct))
    prompts = (
        draw(st.sampled_from(PROMPTS[:2]))
        if one_prompt
        else [PROMPTS[draw(st.integers(0, len(PROMPTS) - 1))] for _ in range(n)]
    )
    if not one_prompt:  # each row's copies keep its prompt
        prompts = [prompts[p] for p in pick]
    return pick, big_t, lengths, prompts, draw(st.integers(0, 2**16))


def _rows(policy, batch):
    pick, big_t, lengths, prompts, seed = batch
    g = torch.Generator().manual_seed(seed)
    legal = torch.tensor(policy.legal_ids)
    distinct = legal[torch.randint(0, len(legal), (max(pick) + 1, big_t), generator=g)]
    tokens = distinct[pick]
    length = torch.tensor(lengths)[pick]
    return prompts, tokens, length, seed


def _check(policy, batch, path: str, monkeypatch, per_state: bool = False) -> None:
    prompts, tokens, length, seed = _rows(policy, batch)
    model = policy.model
    params = [p for p in model.parameters() if p.requires_grad]
    rows = row_prompt_ids(policy.prompt_ids, prompts, tokens.shape[0])
    seen: list[str] = []
    path_of = rescoring.path_of
    with monkeypatch.context() as m:
        m.setattr(rescoring, "path_of", lambda *a, **k: seen.append(path_of(*a, **k)) or seen[-1])
        if per_state:
            states = policy.score_with_states(prompts, tokens, length, lambda x: x.logsumexp(-1))
            got = states[:2]
        else:
            got = policy.score(prompts, tokens, length)
    assert seen == [path]
    want = reference_scores(model, rows, tokens, length, policy.stop_id)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    assert_grads_close(weighted_grads(got, params, seed), weighted_grads(want, params, seed))
    # the reference pass: the base weights (LoRA's adapter off, else the frozen copy), no grad
    ref = policy.reference_score(prompts, tokens, length)
    if hasattr(model, "disable_adapter"):
        with torch.no_grad(), model.disable_adapter():
            base = reference_scores(model, rows, tokens, length, policy.stop_id)
    else:
        with torch.no_grad():
            base = reference_scores(policy.freeze_reference(), rows, tokens, length, policy.stop_id)
    for g, w in zip(ref, base, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


CASES = {
    # case: (policy, rows share one prompt, per-state values, as a sharded model's)
    "compiled_rescoring": ("embedded", True, False, False),
    "lean_gpt2, a prompt per row": ("embedded", False, False, False),
    "lean_gpt2, per-state values": ("embedded", True, True, False),
    "shared_prompts": ("lora", False, False, False),
    "model, sharded": ("lora", False, False, True),
}


@pytest.mark.parametrize("case", list(CASES))
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_path_equals_the_reference(policies, case, data, monkeypatch) -> None:
    name, one_prompt, per_state, sharded = CASES[case]
    batch = data.draw(batches(one_prompt=one_prompt))
    path = case.split(",")[0]
    if path == "lean_gpt2" and len(set(batch[3])) == 1:
        path = "compiled_rescoring"  # rows of one prompt, log-probs only: the compiled path's
    policy = policies[name]
    if sharded:
        monkeypatch.setattr(policy, "step_together", lambda done: done)
    _check(policy, batch, path, monkeypatch, per_state=per_state)
