"""A step's rows (app.training.step_batch): prompt layout, per-row behaviour with replay.md's mix in
expectation, one rollout for all on-policy rows, stored rows as their items, micro-batch slices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from raptb.adapters.tasks.expr24.task import Expr24Task
from raptb.app.reward.prefix import PrefixScorer, ScoredRows
from raptb.app.task_and_policy import build_policy, pad_rows
from raptb.app.training.gflownet.mix_schedule import Mix
from raptb.app.training.gflownet.replay_items import new_items, replay_items
from raptb.app.training.gflownet.row_plan import plan_rows
from raptb.app.training.step import reward, sample_trajectories
from raptb.app.training.step_batch import (
    ORACLE,
    REPLAYED,
    SAMPLED,
    collect_step,
    micro_batches,
    step_prompts,
    stored_rows,
)
from raptb.core.replay import make_buffer


@pytest.fixture(scope="module")
def setup():
    task = Expr24Task()
    policy = build_policy("tiny", task, 0)
    return task, policy, PrefixScorer(task, policy, 50.0)


def test_prompts_run_in_groups_and_continue_across_steps() -> None:
    prompts = ["a", "b", "c"]
    assert step_prompts(prompts, 0, 6, 2) == ["a", "a", "b", "b", "c", "c"]
    assert step_prompts(prompts, 1, 6, 2) == ["a", "a", "b", "b", "c", "c"]
    assert step_prompts(prompts, 0, 5, 2) == ["a", "a", "b", "b", "c"]
    assert step_prompts(prompts, 1, 5, 2) == ["a", "a", "b", "b", "c"]  # 3 prompts a step
    assert step_prompts(prompts, 1, 4, 8) == ["b"] * 4  # one prompt a step


@given(st.lists(st.integers(0, 9), max_size=6), st.integers(1, 12))
def test_micro_batches_cut_the_rows_in_order(sizes: list[int], size: int) -> None:
    rows = [(i, r) for i, n in enumerate(sizes) for r in range(n)]
    batches = micro_batches(sizes, size)
    got = [(i, r) for parts in batches for i, rows_ in parts for r in range(sizes[i])[rows_]]
    assert got == rows
    lengths = [sum(s.stop - s.start for _, s in parts) for parts in batches]
    assert all(n == size for n in lengths[:-1]) and (not lengths or 0 < lengths[-1] <= size)


def _buffer_with_items(setup):
    task, policy, scorer = setup
    batch = sample_trajectories(
        policy, task, task.prompts()[0], 8, 1.0, torch.Generator().manual_seed(0)
    )
    buffer = make_buffer("rp", capacity=50)
    buffer.add(new_items(task, batch, reward(scorer, policy, batch, kappa=0.0)))
    return buffer


def test_plan_draws_replay_md_mix_per_row_in_expectation(setup) -> None:
    buffer = _buffer_with_items(setup)
    prompt = setup[0].prompts()[0]
    mix = Mix(
        p_replay=0.3, low_temp_prob=0.6, temp_lo=0.8, temp_hi=1.5, p_oracle=0.5, oracle_fraction=0.7
    )
    n = 20000
    plan = plan_rows(
        [prompt] * n + ["other"] * 100,
        mix,
        buffer=buffer,
        oracle=buffer,
        rng=np.random.default_rng(0),
    )
    kind, temp = plan.kind[:n], plan.temperature[:n]
    se = 4 / np.sqrt(n)  # four standard errors at most
    assert abs(np.mean(kind == REPLAYED) - 0.3) < se
    assert abs(np.mean(kind == ORACLE) - 0.7 * 0.5 * 0.7) < se
    sampled = temp[kind == SAMPLED]
    tempered = sampled[sampled != 1.0]
    assert abs(len(tempered) / len(sampled) - 0.6) < 2 * se
    assert tempered.min() >= 0.8 and tempered.max() <= 1.5
    assert abs(tempered.mean() - 1.15) < 0.01
    assert np.all(temp[kind != SAMPLED] == 1.0)
    # a prompt without items is never replayed; every stored row has its item
    assert not np.any(plan.kind[n:] == REPLAYED)
    assert set(plan.items) == set(np.flatnonzero(plan.kind != SAMPLED))


def test_collect_step_rolls_out_sampled_rows_once_and_pads_stored_ones(setup, monkeypatch) -> None:
    task, policy, scorer = setup
    prompt = task.prompts()[0]
    solutions = [tuple(policy.tokenizer.encode(t, add_special_tokens=False)) for t in ("4*6",)]
    texts = [scorer.texts(r)[-1] for r in solutions]
    scored = scorer.score_rows(prompt, solutions, task.max_length, texts)
    oracle = make_buffer(
        "oracle", items=replay_items(task, prompt, solutions, texts, scored, range(1), scored.u)
    )
    mix = Mix(0.0, 0.5, 0.7, 1.4, 1.0, 0.5)
    plan = plan_rows([prompt] * 16, mix, buffer=None, oracle=oracle, rng=np.random.default_rng(1))
    calls = []
    sample = type(policy).sample

    def counting(self, prompts, n, **kwargs):
        calls.append((list(prompts), kwargs["temperature"].tolist(), kwargs["record"]))
        return sample(self, prompts, n, **kwargs)

    monkeypatch.setattr(type(policy), "sample", counting)
    step = collect_step(policy, task, plan, range(2, 14), generator=torch.Generator())
    own = np.arange(2, 14)
    sampled = own[plan.kind[own] == SAMPLED]
    spliced = own[plan.kind[own] == ORACLE]
    assert len(sampled) and len(spliced)
    # one rollout, which records nothing: the loss rescores its rows (test_column_head.py)
    temperatures = pytest.approx(plan.temperature[sampled].tolist())
    assert calls == [([prompt] * len(sampled), temperatures, False)]
    first, second = step.pieces
    assert len(first.rows) == len(sampled) and first.on_policy == tuple(range(len(sampled)))
    assert second.rows == (solutions[0],) * len(spliced) and second.on_policy == ()
    assert second.stored_u is None  # oracle rows are scored like sampled ones
    assert torch.equal(second.tokens, pad_rows(second.rows, task.max_length, policy.pad_id))
    assert step.rows == 12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_on_policy_plan_is_a_plan_without_replay_drawing_as_plan_rows_does(seed):
    """The RL baselines' plan (no behaviour mix) against plan_rows with a mix that never replays
    nor splices, at the one-point temperature range [T, T]: the same rows, temperatures and
    kinds, and the shared stream left at the same place (what PPO's shuffles read next)."""
    from raptb.app.training.gflownet.mix_schedule import Mix
    from raptb.app.training.step_batch import on_policy_plan

    draw = np.random.default_rng(seed)
    prompts = [f"p{int(i)}" for i in draw.integers(0, 3, size=int(draw.integers(1, 40)))]
    temperature = float(draw.uniform(0.3, 2.0))
    mix = Mix(
        p_replay=0.0,
        low_temp_prob=1.0,
        temp_lo=temperature,
        temp_hi=temperature,
        p_oracle=0.0,
        oracle_fraction=0.0,
    )
    ours, theirs = np.random.default_rng(seed + 10), np.random.default_rng(seed + 10)
    plan = on_policy_plan(prompts, temperature, ours)
    reference = plan_rows(prompts, mix, buffer=None, oracle=None, rng=theirs)
    assert plan.prompt == reference.prompt and plan.items == reference.items == {}
    assert np.array_equal(plan.kind, reference.kind) and (plan.kind == SAMPLED).all()
    assert np.array_equal(plan.temperature, reference.temperature)
    assert ours.random() == theirs.random()


def test_replayed_rows_keep_their_items_u(setup) -> None:
    """Replayed rows of different lengths: each row's stored u is its item's, in its first tau + 1
    places, 0 after; its tokens padded with the pad id."""
    task, policy, scorer = setup
    prompt = task.prompts()[0]
    texts = ["4*6", "3", "8*3+1-1", "9-1"]
    rows = [tuple(policy.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    scored = scorer.score_rows(prompt, rows, task.max_length, texts)
    u = scored.u + np.random.default_rng(0).random(scored.u.shape)  # distinct values everywhere
    scored = ScoredRows(u=u, scores=scored.scores, s=scored.s)
    items = replay_items(task, prompt, rows, texts, scored, range(4), scored.u)
    stored = stored_rows(policy, prompt, items, task.max_length, replayed=True)
    assert stored.stored_u.shape == (4, task.max_length + 1)
    for b, row in enumerate(rows):
        np.testing.assert_array_equal(stored.stored_u[b, : len(row) + 1], u[b, : len(row) + 1])
        assert not stored.stored_u[b, len(row) + 1 :].any()
    assert torch.equal(stored.tokens, pad_rows(rows, task.max_length, policy.pad_id))
    assert stored_rows(policy, prompt, [], task.max_length, replayed=True).stored_u.shape == (0, 10)
