"""Similarity kernels against slow references (Python sets, RDKit) and the incremental cache."""

from __future__ import annotations

import re
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raptb.core.subm.similarity_cache as similarity_cache_module
from raptb.core.subm.select import QuantisedSimilarity
from raptb.core.subm.similarity import (
    ShingleJaccardSimilarity,
    TanimotoSimilarity,
    edit_distance,
    edit_distances,
    jaccard_matrix,
    pack_bits,
    shingle_ids,
    tanimoto_matrix,
    word_symbols,
)
from raptb.core.subm.similarity_cache import SimilarityCache


def _ref_tanimoto(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.logical_and(a, b).sum()
    union = np.logical_or(a, b).sum()
    return float(inter / union) if union else 0.0


def _ref_shingles(seq, k: int) -> set:
    items = list(seq)
    if not items:
        return set()
    if len(items) <= k:
        return {tuple(items)}
    return {tuple(items[i : i + k]) for i in range(len(items) - k + 1)}


def _ref_jaccard(a, b, k: int) -> float:
    sa, sb = _ref_shingles(a, k), _ref_shingles(b, k)
    union = len(sa | sb)
    return len(sa & sb) / union if union else 0.0


def _ref_levenshtein(a, b) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[-1]


@settings(max_examples=30, deadline=None)
@given(
    n_bits=st.integers(1, 200),
    n=st.integers(1, 6),
    m=st.integers(1, 6),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_tanimoto_matches_bitwise_reference(n_bits, n, m, density, seed):
    rng = np.random.default_rng(seed)
    a = rng.random((n, n_bits)) < density
    b = rng.random((m, n_bits)) < density
    got = tanimoto_matrix(pack_bits(a), pack_bits(b))
    want = np.array([[_ref_tanimoto(x, y) for y in b] for x in a])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_tanimoto_equals_rdkit_bulk_on_morgan_fingerprints():
    pytest.importorskip("rdkit")
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    from raptb.adapters.tasks.smiles.chem_fp import morgan_packed

    smiles = [
        "CCO",
        "c1ccccc1",
        "CC(=O)Oc1ccccc1C(=O)O",
        "CCN(CC)CC",
        "C",
        "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
        "c1ccc2ccccc2c1",
        "O=C(O)c1ccccc1O",
        "CCOC(=O)c1ccccc1N",
    ]
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    fps = [gen.GetFingerprint(Chem.MolFromSmiles(s)) for s in smiles]
    packed = morgan_packed(smiles)
    assert packed.shape == (len(smiles), 32) and packed.dtype == np.uint64
    got = tanimoto_matrix(packed)
    want = np.array([DataStructs.BulkTanimotoSimilarity(fp, fps) for fp in fps])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert not np.allclose(want, np.eye(len(smiles)))


def test_tanimoto_of_empty_fingerprints_is_zero():
    z = np.zeros((2, 32), dtype=np.uint64)
    assert np.all(tanimoto_matrix(z) == 0.0)


@settings(max_examples=40, deadline=None)
@given(
    a=st.lists(st.text(alphabet="0123456789+-*/()", max_size=12), min_size=1, max_size=5),
    b=st.lists(st.text(alphabet="0123456789+-*/()", max_size=12), min_size=1, max_size=5),
    k=st.integers(1, 4),
)
def test_jaccard_on_strings_matches_python_sets(a, b, k):
    got = ShingleJaccardSimilarity(k).pairwise(a, b)
    want = np.array([[_ref_jaccard(x, y, k) for y in b] for x in a])
    np.testing.assert_allclose(got, want, atol=1e-6)


def _ref_word_jaccard(x: str, y: str, k: int) -> float:
    """Slow reference: Python sets of word k-gram tuples (words split by hand, not by regex)."""

    def grams(text: str) -> set[tuple[str, ...]]:
        cleaned = "".join(c if c.isascii() and (c.isalnum() or c == "'") else " " for c in text)
        tokens = [w.strip("'").lower() for w in cleaned.split()]
        tokens = [w for w in tokens if w]
        if not tokens:
            return set()
        if len(tokens) <= k:
            return {tuple(tokens)}
        return {tuple(tokens[i : i + k]) for i in range(len(tokens) - k + 1)}

    ga, gb = grams(x), grams(y)
    union = ga | gb
    return len(ga & gb) / len(union) if union else 0.0


_SENTENCE = st.lists(
    st.sampled_from(["The", "dog", "dogs", "ran", "RAN", "fast", "cat", "sat", ",", ".", "  "]),
    max_size=9,
).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(a=st.lists(_SENTENCE, min_size=1, max_size=5), b=st.lists(_SENTENCE, max_size=5))
def test_word_jaccard_matches_python_sets_of_words(a, b):
    for k in (1, 2):
        got = ShingleJaccardSimilarity(k, words=True).pairwise(a, b)
        want = np.array([[_ref_word_jaccard(x, y, k) for y in b] for x in a])
        want = want.reshape(len(a), len(b))
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_word_unigram_jaccard_by_hand():
    sim = ShingleJaccardSimilarity(1, words=True)
    # {a, dog, runs} vs {the, dog, runs, fast}: 2 shared of 5
    got = sim.pairwise(["A dog runs."], ["The dog RUNS fast"])
    np.testing.assert_allclose(got, [[2 / 5]], atol=1e-7)
    assert sim.pairwise(["dog dog"], ["dog"])[0, 0] == 1.0


@settings(max_examples=40, deadline=None)
@given(
    a=st.lists(st.lists(st.integers(0, 200_000), max_size=10), min_size=1, max_size=5),
    k=st.integers(1, 3),
)
def test_jaccard_on_token_sequences_matches_python_sets(a, k):
    got = jaccard_matrix([shingle_ids(x, k) for x in a])
    want = np.array([[_ref_jaccard(x, y, k) for y in a] for x in a])
    np.testing.assert_allclose(got, want, atol=1e-6)


_MASK64 = (1 << 64) - 1


def _hash_gram(symbols) -> int:
    """A gram's hash as the module computed it in Python integers before its compiled loop:
    FNV-1a over whole symbols, then a splitmix64 finaliser."""
    h = 0xCBF29CE484222325
    for s in symbols:
        h = ((h ^ (s & _MASK64)) * 0x100000001B3) & _MASK64
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
    return h ^ (h >> 31)


def _python_shingle_ids(seq, k: int) -> np.ndarray:
    """The shingle hashes as the module computed them before its compiled loop: each gram's
    ``_hash_gram`` in Python integers, as int64, sorted and unique."""
    symbols = [ord(c) for c in seq] if isinstance(seq, str) else [int(t) for t in seq]
    if not symbols:
        return np.empty(0, dtype=np.int64)
    grams = (
        [symbols]
        if len(symbols) <= k
        else [symbols[i : i + k] for i in range(len(symbols) - k + 1)]
    )
    return np.unique(np.array([_hash_gram(g) for g in grams], dtype=np.uint64).view(np.int64))


@settings(max_examples=80, deadline=None)
@given(
    seq=st.text(max_size=14)
    | st.lists(st.integers(-(2**63), 2**64 - 1), max_size=12)
    | st.lists(st.integers(0, 60), max_size=12).map(tuple),
    k=st.integers(1, 4),
)
def test_shingle_ids_are_the_python_hashes(seq, k):
    """The compiled gram hashes equal the Python ones bit for bit: strings (any code point,
    lone surrogates included), token ids, 64-bit word hashes, negative integers."""
    np.testing.assert_array_equal(shingle_ids(seq, k), _python_shingle_ids(seq, k))


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=30))
def test_word_symbols_are_the_python_hashes(text):
    """Each word's hash, one gram of its characters, equals the Python one (unsigned)."""
    words = re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*", text.lower())
    assert word_symbols(text) == [_hash_gram([ord(c) for c in word]) for word in words]


def test_shingle_ids_are_stable_and_sorted():
    ids = shingle_ids("12+12", 2)
    assert ids.tolist() == sorted(set(ids.tolist()))
    assert ids.size == 3  # "12", "2+", "+1"
    np.testing.assert_array_equal(ids, shingle_ids("12+12", 2))
    with pytest.raises(ValueError, match="k"):
        shingle_ids("abc", 0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 5))
def test_cache_equals_recomputation_and_computes_only_new_pairs(seed, rounds):
    rng = np.random.default_rng(seed)
    universe = pack_bits(rng.random((40, 100)) < 0.2)
    backend = TanimotoSimilarity()
    cache = SimilarityCache(backend)
    previous: set[int] = set()
    for _ in range(rounds):
        keys = [int(i) for i in rng.choice(40, size=int(rng.integers(1, 15)), replace=False)]
        before = cache.pairs_computed
        got = cache.matrix(keys, [universe[i] for i in keys])
        want = tanimoto_matrix(universe[keys])
        np.testing.assert_array_equal(got, want)
        n_new = sum(k not in previous for k in keys)
        assert cache.pairs_computed - before == n_new * len(keys)
        previous = set(keys)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rounds=st.integers(1, 6),
    jaccard=st.booleans(),
    chunk=st.sampled_from([1 << 24, 1, 7, 40]),
)
def test_quantised_cache_equals_rounded_recomputation(seed, rounds, jaccard, chunk):
    # Keys come and go in random order across refreshes; every refresh must equal rounding the
    # full recomputed matrix (values and row sums) while computing only new x all pairs, also
    # when the new x all block is asked for in row chunks (chunk = float32 elements per call).
    with mock.patch.object(similarity_cache_module, "_BLOCK_ELEMENTS", chunk):
        _check_quantised_cache(seed, rounds, jaccard)


def _check_quantised_cache(seed: int, rounds: int, jaccard: bool) -> None:
    rng = np.random.default_rng(seed)
    if jaccard:
        universe: list = [
            "".join(rng.choice(list("12+*"), int(rng.integers(0, 7)))) for _ in range(40)
        ]
        backend: object = ShingleJaccardSimilarity(2)
    else:
        universe = list(pack_bits(rng.random((40, 100)) < 0.2))
        backend = TanimotoSimilarity()
    cache = SimilarityCache(backend)
    previous: set[int] = set()
    for _ in range(rounds):
        keys = [int(i) for i in rng.choice(40, size=int(rng.integers(1, 15)), replace=False)]
        feats = [universe[i] for i in keys]
        before = cache.pairs_computed
        got = cache.quantised(keys, feats)
        want = QuantisedSimilarity.from_float(backend.pairwise(feats, feats))
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.row_sums, want.row_sums)
        n_new = sum(k not in previous for k in keys)
        assert cache.pairs_computed - before == n_new * len(keys)
        previous = set(keys)
        if rng.random() < 0.5:  # what the SubM buffer does after selecting
            kept = [keys[i] for i in rng.permutation(len(keys))[: int(rng.integers(0, 4))]]
            cache.retain(kept)
            previous = set(kept)


def test_cache_retain_keeps_only_given_keys_in_both_forms():
    fps = pack_bits(np.random.default_rng(0).random((6, 64)) < 0.3)
    for form in ("matrix", "quantised"):
        cache = SimilarityCache(TanimotoSimilarity())
        getattr(cache, form)(list("abcd"), list(fps[:4]))
        cache.retain(["c", "a"])
        before = cache.pairs_computed
        got = getattr(cache, form)(["a", "e", "c"], [fps[0], fps[4], fps[2]])
        assert cache.pairs_computed - before == 3  # only e x all
        want = tanimoto_matrix(fps[[0, 4, 2]])
        if form == "quantised":
            want = QuantisedSimilarity.from_float(want).values
            got = got.values
        np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match="not cached"):
            cache.retain(["a", "z"])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), m=st.integers(1, 12))
def test_backends_declared_symmetric_are_bitwise_symmetric(seed, n, m):
    rng = np.random.default_rng(seed)
    a = list(pack_bits(rng.random((n, 70)) < rng.random()))
    b = list(pack_bits(rng.random((m, 70)) < rng.random()))
    tan = TanimotoSimilarity()
    assert tan.symmetric
    np.testing.assert_array_equal(tan.pairwise(a, b), tan.pairwise(b, a).T)
    sa = ["".join(rng.choice(list("ab1+"), int(rng.integers(0, 9)))) for _ in range(n)]
    sb = [[int(t) for t in rng.integers(0, 5, int(rng.integers(0, 9)))] for _ in range(m)]
    jac = ShingleJaccardSimilarity(int(rng.integers(1, 4)))
    assert jac.symmetric
    np.testing.assert_array_equal(jac.pairwise(sa, sa), jac.pairwise(sa, sa).T)
    np.testing.assert_array_equal(jac.pairwise(sb, sb[::-1]), jac.pairwise(sb[::-1], sb).T)


class _Skewed:
    """An undeclared backend: sim(a, b) = a / (a + b + 1) for integers (asymmetric)."""

    def pairwise(self, a, b):
        return np.array([[x / (x + y + 1) for y in b] for x in a], dtype=np.float32)


class _UndeclaredSymmetric:
    def pairwise(self, a, b):
        return np.array([[1.0 / (1 + abs(x - y)) for y in b] for x in a], dtype=np.float32)


def test_quantised_cache_checks_undeclared_backends_and_switches_forms():
    with pytest.raises(ValueError, match="not symmetric"):
        SimilarityCache(_Skewed()).quantised([1, 2, 3], [1, 2, 3])
    cache = SimilarityCache(_UndeclaredSymmetric())
    first = cache.quantised([1, 2], [1, 5])
    np.testing.assert_array_equal(first.values, [[32768, 6554], [6554, 32768]])
    second = cache.quantised([2, 3], [5, 7])  # kept key 2, new key 3
    assert cache.pairs_computed == 2 * 2 + 1 * 2
    np.testing.assert_array_equal(
        second.to_float(), np.round(_UndeclaredSymmetric().pairwise([5, 7], [5, 7]) * 32768) / 32768
    )
    # Asking for the float form recomputes once, then is incremental again.
    np.testing.assert_allclose(cache.matrix([2, 3], [5, 7]), [[1.0, 1 / 3], [1 / 3, 1.0]])
    assert cache.pairs_computed == 6 + 4
    cache.matrix([3], [7])
    assert cache.pairs_computed == 10
    with pytest.raises(ValueError, match="shape"):
        SimilarityCache(
            type("Bad", (), {"pairwise": lambda self, a, b: np.zeros((1, 1))})()
        ).quantised([1, 2], [1, 2])


def test_cache_rejects_bad_input():
    cache = SimilarityCache(ShingleJaccardSimilarity())
    with pytest.raises(ValueError, match="unique"):
        cache.matrix(["a", "a"], ["x", "y"])
    with pytest.raises(ValueError, match="differ in length"):
        cache.matrix(["a"], ["x", "y"])


@settings(max_examples=50, deadline=None)
@given(
    a=st.lists(st.integers(0, 5), max_size=12),
    others=st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=1, max_size=4),
)
def test_edit_distance_matches_reference(a, others):
    assert edit_distance(a, others[0]) == _ref_levenshtein(a, others[0])
    np.testing.assert_array_equal(
        edit_distances(a, others), [_ref_levenshtein(a, o) for o in others]
    )
