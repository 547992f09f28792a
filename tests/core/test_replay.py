"""Replay buffers: item validation, RP/PRT invariants, SubM refresh, Oracle, persistence."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.replay import (
    PrioritizedReplayTraining,
    ReplayBuffer,
    ReplayItem,
    RewardPrioritizedBuffer,
    SubmodularBuffer,
    make_buffer,
)
from raptb.core.replay.item import pack_items, unpack_items
from raptb.core.subm.select import subm_select
from raptb.core.subm.similarity import ShingleJaccardSimilarity, edit_distance, pack_bits

# The paper's SubM columns (the task specs of the adapters hold the same values).
EXPR24_SUBM = {
    "w_rew": 1.0,
    "w_val": 1.0,
    "w_div": 1.0,
    "w_len": 0.0,
    "gating_ratio": 1.0,
    "similarity": "jaccard",
    "shingle_k": 2,
    "shingle_on": "text",
}
SMILES_SUBM = {
    "w_rew": 1.0,
    "w_val": 1.0,
    "w_div": 1.0,
    "w_len": 1.0,
    "gating_ratio": 0.0,
    "similarity": "tanimoto",
    "length_bin_size": 1,
}


def item(tokens, r: float, prompt: str = "p", valid: bool = True, text=None, **kw) -> ReplayItem:
    tokens = tuple(tokens)
    log_r = np.linspace(-5.0, r, len(tokens) + 1)
    u = np.zeros(len(tokens) + 1)
    u[-1] = r
    kw.setdefault("score", r)
    return ReplayItem(prompt, tokens, text or "-".join(map(str, tokens)), log_r, u, valid, **kw)


def _state_roundtrip(state: dict) -> dict:
    """What a checkpoint sees: arrays stay arrays, everything else must survive JSON."""
    arrays = {}

    def strip(x, path):
        if isinstance(x, np.ndarray):
            arrays[path] = x.copy()
            return {"__array__": path}
        if isinstance(x, dict):
            return {k: strip(v, f"{path}/{k}") for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v, f"{path}/{i}") for i, v in enumerate(x)]
        return x

    def restore(x):
        if isinstance(x, dict):
            if "__array__" in x:
                return arrays[x["__array__"]]
            return {k: restore(v) for k, v in x.items()}
        if isinstance(x, list):
            return [restore(v) for v in x]
        return x

    return restore(json.loads(json.dumps(strip(state, ""))))


def test_item_validates_shapes_and_exposes_terminal_values():
    it = item([1, 2, 3], 0.5)
    assert it.length == 3 and it.terminal_log_r == 0.5 and it.terminal_u == 0.5
    assert it.key == it.text
    assert not it.log_r.flags.writeable
    with pytest.raises(ValueError, match="log_r"):
        ReplayItem("p", (1, 2), "x", np.zeros(2), np.zeros(3), True)
    with pytest.raises(ValueError, match="u must"):
        ReplayItem("p", (1, 2), "x", np.zeros(3), np.zeros(4), True)
    with pytest.raises(ValueError, match="features"):
        ReplayItem("p", (1,), "x", np.zeros(2), np.zeros(2), True, features=np.zeros((2, 2)))


def test_rp_priority_is_terminal_log_reward_not_prefix_sum():
    buf = RewardPrioritizedBuffer(capacity=2, tolerance=0.0)
    long_good = ReplayItem("p", (1, 2, 3, 4), "a", [-9, -9, -9, -9, 2.0], np.zeros(5), True)
    short_bad = ReplayItem("p", (5,), "b", [0.0, 0.5], np.zeros(2), True)
    mid = ReplayItem("p", (6, 7), "c", [0.0, 0.0, 1.0], np.zeros(3), True)
    buf.add([long_good, short_bad, mid])
    kept = {it.text for it in buf.items()}
    # A prefix-sum priority would keep the short one (sum -36 for long_good vs 0.0).
    assert kept == {"a", "c"}


def test_rp_exact_and_near_duplicate_filter_fires():
    buf = RewardPrioritizedBuffer(capacity=10, tolerance=0.25)
    buf.add([item([1, 2, 3, 4, 5, 6, 7, 8], 1.0)])
    buf.add([item([1, 2, 3, 4, 5, 6, 7, 8], 2.0)])  # exact duplicate tokens
    assert len(buf) == 1
    near = item([1, 2, 3, 4, 5, 6, 7, 9], 0.5)  # distance 1 < 0.25 * 16, lower reward
    buf.add([near])
    assert len(buf) == 1
    far = item([9, 9, 9, 9, 1, 1, 1, 1], 0.5)  # distance 8 >= 4
    better_near = item([1, 2, 3, 4, 5, 6, 7, 0], 3.0)  # near but higher reward: accepted
    buf.add([far, better_near])
    assert len(buf) == 3
    forced = RewardPrioritizedBuffer(capacity=10, force_valid=True)
    forced.add([item([1, 2, 3, 4, 5, 6, 7, 8], 1.0), near])
    assert len(forced) == 2


@settings(max_examples=30, deadline=None)
@given(
    seqs=st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=6),
            # ties are common: the filter's ">=" against ">" is what they tell apart
            st.one_of(st.integers(-2, 2).map(float), st.floats(-5, 5)),
        ),
        max_size=40,
    ),
    capacity=st.integers(1, 8),
)
def test_rp_invariants(seqs, capacity):
    buf = RewardPrioritizedBuffer(capacity=capacity, tolerance=0.25)
    buf.add([item(t, r) for t, r in seqs])
    stored = buf.items() if len(buf) else []
    assert len(stored) <= capacity
    assert len({s.tokens for s in stored}) == len(stored)
    # (terminal log-reward, insertion number, item) of every stored item
    entries = [entry for heap in buf._heaps.values() for entry in heap]
    for _, first, a in entries:
        for _, later, b in entries:
            close = edit_distance(a.tokens, b.tokens) < 0.25 * (a.length + b.length)
            # A near pair can only exist when the later one beat the earlier one's reward.
            if close and first < later:
                assert b.terminal_log_r > a.terminal_log_r


def test_rp_keeps_top_by_reward_without_filter():
    buf = RewardPrioritizedBuffer(capacity=5, tolerance=0.0)
    rs = np.random.default_rng(0).permutation(20).astype(float)
    buf.add([item([int(i), 100 + int(i)], r) for i, r in enumerate(rs)])
    assert sorted(it.terminal_log_r for it in buf.items()) == [15, 16, 17, 18, 19]


def test_prt_tier_proportions():
    buf = PrioritizedReplayTraining(capacity=100, tolerance=0.0, alpha=0.7, beta=0.2)
    buf.add([item([i, i + 1000], float(i)) for i in range(100)])
    top, _rest = buf.tiers()
    assert len(top) == 20 and min(t.terminal_log_r for t in top) == 80.0
    rng = np.random.default_rng(0)
    n, draws = 10, 2000
    hits = sum(s.terminal_log_r >= 80 for _ in range(draws) for s in buf.sample(n, rng))
    p = hits / (n * draws)
    # Binomial-ish standard error is below 0.005; 5 sigma.
    assert abs(p - 0.7) < 0.025
    odd = [sum(s.terminal_log_r >= 80 for s in buf.sample(3, rng)) for _ in range(4000)]
    assert abs(np.mean(odd) - 2.1) < 0.05  # alpha * n with a fractional part


def test_sample_requires_prompt_when_ambiguous_and_routes_by_prompt():
    buf = make_buffer("rp")
    buf.add([item([1], 1.0, prompt="a"), item([2], 1.0, prompt="b"), item([3], 1.0, prompt="b")])
    assert len(buf) == 3 and sorted(buf.prompts()) == ["a", "b"]
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="prompt"):
        buf.sample(2, rng)
    assert {s.prompt for s in buf.sample(10, rng, prompt="b")} == {"b"}
    with pytest.raises(ValueError, match="no items"):
        buf.sample(1, rng, prompt="zzz")


def _expr_items(rng, n, prompt="p"):
    ops = "+-*/"
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 5))
        toks = [
            int(rng.integers(1, 14)) if i % 2 == 0 else 20 + int(rng.integers(0, 4))
            for i in range(2 * k - 1)
        ]
        text = "".join(str(t) if t < 20 else ops[t - 20] for t in toks)
        r = float(rng.normal())
        out.append(item(toks, r, prompt=prompt, valid=bool(rng.random() < 0.8), text=text))
    return out


@pytest.mark.parametrize("diversity", ["facility", "dispersion"])
def test_subm_refresh_equals_direct_selection_on_deduplicated_ground_set(diversity):
    rng = np.random.default_rng(1)
    buf = make_buffer("subm", **EXPR24_SUBM, capacity=15, diversity=diversity)
    first = _expr_items(rng, 30)
    buf.add(first)
    assert 0 < len(buf) <= 15
    assert all(it.valid for it in buf.items())  # gating ratio 1 for Expr24
    before = buf.items()
    batch = _expr_items(rng, 10)
    buf.add(batch)
    ground = {}
    for it in before + batch:
        if it.key not in ground or it.terminal_log_r > ground[it.key].terminal_log_r:
            ground[it.key] = it
    cand = list(ground.values())
    sim = ShingleJaccardSimilarity(2).pairwise([c.text for c in cand], [c.text for c in cand])
    static = np.array([c.terminal_log_r + c.valid for c in cand])
    want = subm_select(
        sim,
        static,
        np.array([c.length for c in cand]),
        15,
        w_len=0.0,
        valid=np.array([c.valid for c in cand]),
        gating_ratio=1.0,
        diversity=diversity,
    )
    assert [it.text for it in buf.items()] == [cand[i].text for i in want]
    assert buf.config()["diversity"] == diversity
    with pytest.raises(ValueError, match="diversity"):
        make_buffer("subm", **EXPR24_SUBM, diversity="coverage")


def test_subm_smiles_preset_uses_fingerprints_and_dedups_canonical():
    rng = np.random.default_rng(2)
    fps = pack_bits(rng.random((12, 2048)) < 0.03)
    items = [
        item([i, i + 1], 0.0, canonical=f"C{i % 10}", features=fps[i], valid=i != 3)
        for i in range(12)
    ]
    buf = make_buffer("subm", **SMILES_SUBM, capacity=200)
    assert isinstance(buf, SubmodularBuffer) and buf.w_len == 1.0 and buf.gating_ratio == 0.0
    buf.add(items)
    keys = [it.key for it in buf.items()]
    assert len(keys) == len(set(keys)) == 10  # items 10, 11 duplicate C0, C1
    with pytest.raises(ValueError, match="features"):
        buf.add([item([1], 0.0, canonical="X", features=np.zeros(3, dtype=np.uint64))])


def test_subm_reward_choice():
    hi_u = ReplayItem("p", (1,), "a", [0.0, -50.0], [0.0, 5.0], True, score=0.1)
    lo_u = ReplayItem("p", (2,), "b", [0.0, -0.1], [0.0, 0.0], True, score=0.0)
    by_log_r = SubmodularBuffer(capacity=1, w_div=0.0, w_len=0.0, reward="log_r")
    by_log_r.add([hi_u, lo_u])
    by_u = SubmodularBuffer(capacity=1, w_div=0.0, w_len=0.0, reward="u")
    by_u.add([hi_u, lo_u])
    assert by_log_r.items()[0].text == "b" and by_u.items()[0].text == "a"
    with pytest.raises(ValueError, match="reward"):
        SubmodularBuffer(reward="lambda")


def test_subm_static_reward_is_the_task_score_not_lambda_times_it():
    # lambda = 50: a wrong-but-scored item (S = 1, u = 50, invalid) against a valid one with
    # S = 0.1 (u = 5). s(x) = w_rew S + w_val 1[valid]: 1.0 vs 1.1, the valid one wins; with
    # lambda S (the old default) 50 vs 6 it would lose.
    scored = ReplayItem("p", (1,), "a", [0.0, 50.0], [0.0, 50.0], False, score=1.0)
    valid = ReplayItem("p", (2,), "b", [0.0, 5.0], [0.0, 5.0], True, score=0.1)
    buf = SubmodularBuffer(capacity=1, w_div=0.0, w_len=0.0)
    buf.add([scored, valid])
    assert [it.text for it in buf.items()] == ["b"]
    assert buf.config()["reward"] == "score"
    static = buf._static([scored, valid])
    np.testing.assert_allclose(static, [1.0 * 1.0 + 0.0, 1.0 * 0.1 + 1.0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="score"):
        buf.add([ReplayItem("p", (3,), "c", [0.0, 1.0], [0.0, 1.0], True)])


def test_items_packed_before_scores_existed_still_load():
    items = [item([1, 2], 0.5), item([3], 0.25, score=None)]
    packed = pack_items(items)
    assert np.isnan(packed["score"][1])
    restored = unpack_items(packed)
    assert [it.score for it in restored] == [0.5, None]
    del packed["score"]  # a checkpoint written before items carried a score
    old = unpack_items(packed)
    assert [it.score for it in old] == [None, None]
    assert [it.text for it in old] == [it.text for it in items]
    with pytest.raises(ValueError, match="score"):
        item([1], 0.5, score=float("nan"))


def test_oracle_draws_uniformly_from_given_items():
    sols = [item([i], 1.0) for i in range(4)]
    buf = make_buffer("oracle", items=sols)
    assert len(buf) == 4
    rng = np.random.default_rng(0)
    counts = np.bincount([s.tokens[0] for s in buf.sample(8000, rng)], minlength=4)
    assert np.all(np.abs(counts / 8000 - 0.25) < 0.02)


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("rp", {}),
        ("prt", {}),
        ("subm", {**EXPR24_SUBM, "capacity": 20}),
        ("subm", {**SMILES_SUBM, "capacity": 20}),
        ("oracle", {}),
    ],
)
def test_state_dict_roundtrip_restores_identical_sampling(kind, kwargs):
    rng = np.random.default_rng(3)
    fps = pack_bits(rng.random((60, 128)) < 0.1)
    items = [
        ReplayItem(
            it.prompt, it.tokens, it.text, it.log_r, it.u, it.valid, features=fps[i], score=it.score
        )
        for i, it in enumerate(_expr_items(rng, 30) + _expr_items(rng, 30, prompt="q"))
    ]
    buf = make_buffer(kind, **kwargs)
    buf.add(items[:40])
    clone = make_buffer(kind, **kwargs)
    clone.load_state_dict(_state_roundtrip(buf.state_dict()))
    assert len(clone) == len(buf)
    for prompt in ("p", "q"):
        a = buf.sample(25, np.random.default_rng(7), prompt=prompt)
        b = clone.sample(25, np.random.default_rng(7), prompt=prompt)
        assert [x.tokens for x in a] == [x.tokens for x in b]
        assert all(np.array_equal(x.log_r, y.log_r) for x, y in zip(a, b, strict=True))
    # Later adds evolve identically too.
    buf.add(items[40:])
    clone.add(items[40:])
    for prompt in ("p", "q"):
        assert [x.tokens for x in buf.items(prompt)] == [x.tokens for x in clone.items(prompt)]
    with pytest.raises(ValueError, match="kind"):
        make_buffer("rp" if kind != "rp" else "prt").load_state_dict(buf.state_dict())


def test_factory_and_constructor_errors():
    with pytest.raises(ValueError, match="kind"):
        make_buffer("fifo")
    with pytest.raises(ValueError, match="capacity"):
        make_buffer("rp", capacity=0)
    with pytest.raises(ValueError, match="alpha"):
        make_buffer("prt", alpha=1.5)
    with pytest.raises(ValueError, match="w_div"):
        make_buffer("subm", w_div=-1.0)
    with pytest.raises(ValueError, match="items"):
        make_buffer("rp").add(["not an item"])
    with pytest.raises(ValueError, match="config"):
        make_buffer("rp", capacity=3).load_state_dict(make_buffer("rp").state_dict())
    assert math.isclose(make_buffer("prt").alpha, 0.7)


def test_subm_word_unigram_jaccard_selects_on_words():
    # CommonGen's column: word-unigram Jaccard, length bins of 4, w_len 0
    words = ["dog", "cat", "ran", "sat", "the", "a", "field", "park"]
    rng = np.random.default_rng(3)
    texts = list(
        dict.fromkeys(" ".join(rng.choice(words, size=rng.integers(2, 6))) for _ in range(40))
    )
    items = [item(range(len(t)), float(rng.random()), text=t) for t in texts]
    buf = make_buffer(
        "subm",
        capacity=8,
        w_rew=1.0,
        w_val=1.0,
        w_div=2.0,
        w_len=0.0,
        gating_ratio=1.0,
        similarity="jaccard",
        shingle_k=1,
        shingle_on="words",
        length_bin_size=4,
    )
    buf.add(items)
    sim = ShingleJaccardSimilarity(1, words=True).pairwise(texts, texts)
    want = subm_select(
        sim,
        np.array([it.terminal_u + 1.0 for it in items]),
        np.array([it.length // 4 for it in items]),
        8,
        w_div=2.0,
        w_len=0.0,
        valid=np.ones(len(items), dtype=bool),
        gating_ratio=1.0,
    )
    assert [it.text for it in buf.items()] == [texts[i] for i in want]
    with pytest.raises(ValueError, match="shingle_on"):
        make_buffer("subm", shingle_on="sentences")


def test_the_buffer_registry_builds_every_kind_and_refuses_a_second_kind_of_a_name():
    from raptb.core.replay import BUFFERS, buffer_class, register_buffer

    assert tuple(BUFFERS) == ("rp", "prt", "subm", "oracle")
    for kind, cls in BUFFERS.items():
        assert buffer_class(kind) is cls and cls.kind == kind
    options = {"capacity": 7, "rp_tolerance": 0.5, "prt_alpha": 0.6, "prt_beta": 0.3}
    assert buffer_class("prt").config_kwargs(options) == {
        "capacity": 7,
        "tolerance": 0.5,
        "alpha": 0.6,
        "beta": 0.3,
    }
    with pytest.raises(ValueError, match="not built from keyword arguments"):
        buffer_class("oracle").config_kwargs(options)

    class Other(RewardPrioritizedBuffer):
        kind = "rp"

    with pytest.raises(ValueError, match="'rp' is already registered"):
        register_buffer(Other)
    with pytest.raises(ValueError, match=r"unknown replay kind 'nope'"):
        make_buffer("nope")


def test_add_to_prompt_is_the_method_a_buffer_implements_and_the_old_name_still_works():
    items = _expr_items(np.random.default_rng(0), 6)

    class Newest(ReplayBuffer):
        kind = "newest_items"

        def add_to_prompt(self, prompt, new):
            self._stores[prompt] = [*self._stores.get(prompt, []), *new][-4:]

    with pytest.warns(DeprecationWarning, match=r"Old._add_to_prompt is deprecated: name it add_"):

        class Old(ReplayBuffer):
            kind = "old_items"

            def _add_to_prompt(self, prompt, new):
                self._stores[prompt] = [*self._stores.get(prompt, []), *new][-4:]

    for cls in (Newest, Old):
        buffer = cls()
        buffer.add(items)
        assert buffer.items() == items[-4:], cls
    with pytest.raises(TypeError, match="abstract"):
        type("Nothing", (ReplayBuffer,), {"kind": "nothing"})()
