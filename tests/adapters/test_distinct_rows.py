"""A scoring forward over the distinct rows only (``adapters.lm.distinct_rows``): the grouping
against a plain Python reference on random batches full of copies, and ``HFPolicy.score`` (and
with hidden states or per-state values) with the copies merged against every row's own forward by
transformers (the reference), its values and every parameter's gradient, on the lean GPT-2 path
and on transformers' forward, one prompt and per-row prompts; no merging where the forward is
random (dropout in training mode); the main job's steps merge copies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm import rescoring
from raptb.adapters.lm.distinct_rows import distinct_rows, stochastic_forward
from raptb.adapters.lm.rollout_record import softmax_entropy
from raptb.adapters.lm.row_prompts import row_prompt_ids
from tests.adapters.reference_scores import reference_scores
from tests.adapters.test_lean_gpt2 import _model_path
from tests.adapters.test_policy import make_policy


def reference_groups(keys: list[tuple]) -> tuple[list[int], list[int]]:
    """First index of each distinct key, in order of appearance, and each row's group."""
    first: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    order = list(first.values())
    return order, [order.index(first[key]) for key in keys]


@st.composite
def batches(draw):
    """Rows drawn from a few distinct (prompt, length, tokens) values, so copies are common;
    ids after a row's length are set to one value, as ``_forward_log_probs`` does."""
    width = draw(st.integers(1, 5))
    pool = draw(
        st.lists(
            st.tuples(
                st.sampled_from([(1,), (1, 2), (3, 1, 2)]),
                st.integers(0, width),
                st.lists(st.integers(0, 4), min_size=width, max_size=width),
            ),
            min_size=1,
            max_size=6,
        )
    )
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=0, max_size=24))
    rows = [pool[i] for i in picks]
    prompts = [list(prompt) for prompt, _, _ in rows]
    length = torch.tensor([n for _, n, _ in rows], dtype=torch.long)
    body = torch.tensor([ids for _, _, ids in rows], dtype=torch.long).reshape(len(rows), width)
    body = torch.where(torch.arange(width) < length[:, None], body, 9)
    return prompts, body, length


@settings(max_examples=200, deadline=None)
@given(batches())
def test_the_groups_are_the_first_copies_in_order(batch) -> None:
    prompts, body, length = batch
    keys = [
        (tuple(p), int(n), tuple(row.tolist()))
        for p, n, row in zip(prompts, length, body, strict=True)
    ]
    first, group = reference_groups(keys)
    got = distinct_rows(prompts, body, length)
    if len(first) == len(keys):
        assert got is None  # nothing to merge: the forward takes every row as it is
        return
    assert got is not None
    assert got.first.tolist() == first
    assert got.inverse.tolist() == group
    values = torch.arange(len(first), dtype=torch.float32)[:, None] * torch.ones(1, 3)
    assert got.gather(values)[:, 0].tolist() == [float(g) for g in group]


def test_what_makes_two_rows_the_same() -> None:
    body = torch.tensor([[1, 2, 9], [1, 2, 9], [1, 2, 9], [1, 2, 9]])
    # rows 0 and 1 the same; row 2 another prompt; row 3 another length (its stop comes later)
    got = distinct_rows([[5], [5], [6], [5]], body, torch.tensor([2, 2, 2, 3]))
    assert got is not None
    assert got.first.tolist() == [0, 2, 3] and got.inverse.tolist() == [0, 0, 1, 2]
    assert distinct_rows([[5]], body[:1], torch.tensor([2])) is None
    assert distinct_rows([[5], [6]], body[:2], torch.tensor([2, 2])) is None


def copies_batch(policy, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """12 rows of 5 distinct trajectories (ids after the stop differing between copies)."""
    g = torch.Generator().manual_seed(seed)
    legal = torch.tensor(policy.legal_ids)
    distinct = legal[torch.randint(0, len(legal), (5, 6), generator=g)]
    lengths = torch.tensor([6, 3, 0, 5, 3])
    pick = [0, 1, 0, 2, 3, 1, 1, 4, 0, 3, 2, 1]
    tokens = distinct[pick].clone()
    noise = legal[torch.randint(0, len(legal), tokens.shape, generator=g)]
    after = torch.arange(6)[None, :] >= lengths[pick][:, None]
    tokens[after] = noise[after]  # a copy may carry other ids after its stop
    return tokens, lengths[pick], pick


def assert_grads_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Each parameter's gradient within 1e-5 of its largest entry: summing copies before the
    backward reorders float additions over sums of hundreds (both sides are ~1e-6 of the scale
    from a float64 evaluation)."""
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5 * float(w.abs().max()), rtol=0)


def score_and_grads(policy, call) -> tuple[tuple[torch.Tensor, ...], list]:
    policy.model.zero_grad(set_to_none=True)
    outputs = call()
    weights = torch.linspace(0.5, 2.0, outputs[0].shape[0])  # copies weigh differently
    sum((out * weights.reshape(-1, *[1] * (out.ndim - 1))).sum() for out in outputs).backward()
    grads = [p.grad.clone() for p in policy.model.parameters()]
    return tuple(out.detach() for out in outputs), grads


def every_row(policy, prompt, tokens, length, per_state=None, hidden=False):
    """The reference: each row's own forward of its prompt and its T tokens (the stop id after its
    length), with ``output_hidden_states``; log-probs, then the hidden states or ``per_state`` of
    the logits, 0 after the row's stop (as ``score_with_*`` return them)."""
    n, big_t = tokens.shape
    rows = row_prompt_ids(policy.prompt_ids, prompt, n)
    log_pf, log_pterm = reference_scores(policy.model, rows, tokens, length, policy.stop_id)
    if per_state is None and not hidden:
        return log_pf, log_pterm
    extra = []
    for row, body, tau in zip(rows, tokens, length.tolist(), strict=True):
        body = torch.where(torch.arange(big_t) < tau, body, policy.stop_id)
        out = policy.model(
            input_ids=torch.cat([torch.tensor(row), body])[None], output_hidden_states=True
        )
        if hidden:
            extra.append(out.hidden_states[-1][0])
        else:
            values = per_state(out.logits[:, len(row) - 1 :])[0]
            extra.append(torch.where(torch.arange(big_t + 1) <= tau, values, 0.0))
    return log_pf, log_pterm, torch.stack(extra)


@pytest.mark.parametrize("path", ["lean", "model"])
@pytest.mark.parametrize("per_row_prompts", [False, True])
def test_merged_score_equals_every_row_computed(path, per_row_prompts, monkeypatch) -> None:
    policy = make_policy(seed=2, logit_scale=4.0)
    if path == "model":
        _model_path(policy, monkeypatch)
    tokens, length, pick = copies_batch(policy, seed=7)
    prompt = [("24:", "Make 24:")[i % 2] for i in pick] if per_row_prompts else "24:"
    forwards = rows_per_forward(monkeypatch)
    merged, merged_grads = score_and_grads(policy, lambda: policy.score(prompt, tokens, length))
    assert forwards == [5]  # the forward saw the 5 distinct rows
    full, full_grads = score_and_grads(policy, lambda: every_row(policy, prompt, tokens, length))
    for got, want in zip(merged, full, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert_grads_close(merged_grads, full_grads)


def test_hidden_states_and_per_state_values_are_gathered_too() -> None:
    policy = make_policy(seed=3, logit_scale=4.0)
    tokens, length, _ = copies_batch(policy, seed=8)
    calls = {
        "hidden": (
            lambda: policy.score_with_hidden("24:", tokens, length),
            lambda: every_row(policy, "24:", tokens, length, hidden=True),
        ),
        "entropy": (
            lambda: policy.score_with_entropy("24:", tokens, length),
            lambda: every_row(policy, "24:", tokens, length, per_state=softmax_entropy),
        ),
    }
    for call, reference in calls.values():
        merged, merged_grads = score_and_grads(policy, call)
        full, full_grads = score_and_grads(policy, reference)
        for got, want in zip(merged, full, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert_grads_close(merged_grads, full_grads)


def rows_per_forward(monkeypatch) -> list[int]:
    """The rows of each scoring forward from now on (appended as they run)."""
    forwards: list[int] = []
    rows_log_probs = rescoring.rows_log_probs

    def counted(policy, model, prompt, rows, body, *args):
        forwards.append(body.shape[0])
        return rows_log_probs(policy, model, prompt, rows, body, *args)

    monkeypatch.setattr(rescoring, "rows_log_probs", counted)
    return forwards


def test_a_random_forward_is_not_merged(monkeypatch) -> None:
    policy = make_policy(seed=4)
    model = policy.model
    assert not stochastic_forward(model.train())  # the embedded model has no dropout
    model.transformer.drop.p = 0.1
    assert stochastic_forward(model.train()) and not stochastic_forward(model.eval())
    model.transformer.drop.p = 0.0
    model.config.attention_dropout = 0.2  # transformers' functional attention dropout
    assert stochastic_forward(model.train())
    tokens, length, _ = copies_batch(policy, seed=9)
    forwards = rows_per_forward(monkeypatch)
    policy.score("24:", tokens, length)
    model.eval()
    with torch.no_grad():
        policy.score("24:", tokens, length)
    assert forwards == [12, 5]  # every row in training mode, the distinct in eval


def test_the_main_jobs_steps_merge_copies(tmp_path, monkeypatch) -> None:
    """The main job's steps score copies once (the rollout repeats itself): in every step's
    rescoring some rows are copies."""
    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    merged_rows: list[int] = []
    find = rescoring.distinct_rows

    def counted(prompts, body, length):
        found = find(prompts, body, length)
        if torch.is_grad_enabled():  # the rescoring, not the reference pass
            merged_rows.append(0 if found is None else body.shape[0] - len(found.first))
        return found

    monkeypatch.setattr(rescoring, "distinct_rows", counted)
    overrides = {"task": "expr24", "loss": "raptb", "replay.kind": "subm", "seed": 3}
    Trainer(build_config(overrides=overrides | {"steps": 4}), tmp_path, progress=False).train()
    assert len(merged_rows) == 4 and min(merged_rows) > 0
