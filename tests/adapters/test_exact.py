"""Exact behaviour log-probabilities (adapters.lm.exact) against brute force and against sampling.

Reference: a brute-force walk over every token path the sampler can take, one plain causal
forward pass per visited prefix (no trie, no tree attention, no batching), masks from a grammar
matcher stepped token by token, and the restricted softmax written out from the rules of
``HFPolicy.sample``. Sampling checks use explicit binomial bounds (4 sigma).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import xgrammar as xgr
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from raptb.adapters.lm.exact import exact_log_probs
from raptb.adapters.lm.grammar import compile_grammar
from raptb.adapters.lm.models import build_tiny_model, load_model_and_tokenizer
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.adapters.tasks.expr24.task import Expr24Task, evaluate_expression, expr24_grammar

torch.set_num_threads(1)
PROMPT = "Expr24:"
# "a" is a dead end below min_length 2 (complete, nothing may follow): the sampler stops there
TOY_GRAMMAR = 'root ::= "a" | "b" "a" "b"*'


def sharpened(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Scale the final layer norm so that a fresh, near-uniform model has uneven probabilities."""
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(scale)
    return model


def expr24_policy(min_length: int, max_length: int, *, seed: int = 0, scale: float = 4.0):
    model, tokenizer = load_model_and_tokenizer("tiny", seed=seed)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, Expr24Task().alphabet, stop_id=stop)
    grammar = expr24_grammar(min_length, max_length)
    model = sharpened(model, scale)
    return HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=grammar)


def toy_policy(grammar: str | None, *, seed: int = 1) -> HFPolicy:
    """Tiny model over a word-level vocabulary with a two-character token: "ab" has two token
    paths ("a" "b" and "ab"), so pi(text) must sum over tokenisations."""
    vocab = {"a": 0, "b": 1, "ab": 2, "<eos>": 3, "<pad>": 4, "<unk>": 5}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<eos>",
        bos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    model = sharpened(build_tiny_model(tokenizer, seed=seed), 4.0)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, "ab", stop_id=stop)
    assert sorted(legal) == [0, 1, 2]
    return HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=grammar)


def brute_force(
    policy: HFPolicy, prompt: str, min_length: int, max_length: int
) -> dict[str, float]:
    """pi(text) of every text the sampler can emit, by walking every token path."""
    num_legal = len(policy.legal_ids)
    columns = [*policy.legal_ids, policy.stop_id]
    matcher = None
    if policy.grammar is not None:
        matcher = xgr.GrammarMatcher(compile_grammar(tuple(policy.texts), policy.grammar))
    bitmask = xgr.allocate_token_bitmask(1, num_legal + 1)
    found: dict[str, float] = {}

    def emit(text: str, log_p: float) -> None:
        found[text] = found.get(text, 0.0) + math.exp(log_p)

    def walk(path: list[int], log_p: float) -> None:
        ids = policy.prompt_ids(prompt) + [policy.legal_ids[j] for j in path]
        with torch.no_grad():
            z = policy.model(torch.tensor([ids])).logits[0, -1].double()[columns]
        text = "".join(policy.texts[j] for j in path)
        if len(path) == max_length:
            emit(text, log_p)  # stop forced
            return
        if matcher is None:
            allowed, complete = [True] * num_legal, True
        else:
            matcher.fill_next_token_bitmask(bitmask, 0)
            bits = [(int(bitmask[0, j // 32]) >> (j % 32)) & 1 for j in range(num_legal + 1)]
            allowed, complete = [bool(b) for b in bits[:num_legal]], bool(bits[num_legal])
        can_stop = (complete and len(path) >= min_length) or not any(allowed)
        actions = [j for j in range(num_legal) if allowed[j]] + ([num_legal] if can_stop else [])
        log_norm = float(torch.logsumexp(z[actions], dim=0))
        if can_stop:
            emit(text, log_p + float(z[num_legal]) - log_norm)
        for j in actions:
            if j == num_legal:
                continue
            if matcher is not None:
                assert matcher.accept_token(j)
            walk([*path, j], log_p + float(z[j]) - log_norm)
            if matcher is not None:
                matcher.rollback(1)

    policy.model.eval()
    walk([], 0.0)
    return found


def all_strings(alphabet: str, longest: int) -> list[str]:
    out = [""]
    for n in range(1, longest + 1):
        out += [s + c for s in out if len(s) == n - 1 for c in alphabet]
    return out


def short_sentences() -> list[str]:
    """Every Expr24 sentence of 1 or 3 characters (9 + 324)."""
    return [t for t in all_strings(Expr24Task().alphabet, 3) if evaluate_expression(t) is not None]


def test_expr24_short_lengths_match_brute_force():
    policy = expr24_policy(1, 3)
    reference = brute_force(policy, PROMPT, 1, 3)
    sentences = short_sentences()
    assert set(reference) == set(sentences)  # the sampler emits exactly the grammar's sentences
    assert sum(reference.values()) == pytest.approx(1.0, abs=1e-9)
    off = ["12", "1+", "+1", "", "1+2+3", "0"]
    result = exact_log_probs(policy, PROMPT, sentences + off, min_length=1, max_length=3)
    want = np.log([reference[t] for t in sentences])
    np.testing.assert_allclose(result.log_prob[: len(sentences)], want, rtol=0, atol=1e-6)
    assert np.all(result.log_prob[len(sentences) :] == -np.inf)
    live = np.isfinite(result.path_log_prob)  # "" and "1+" are trie nodes the sampler never ends at
    assert sorted(result.path_text[live].tolist()) == list(range(len(sentences)))  # one path each
    lengths = np.array([len(t) for t in result.texts])
    np.testing.assert_array_equal(result.path_length, lengths[result.path_text])


@pytest.mark.parametrize("grammar", [TOY_GRAMMAR, None])
def test_every_emittable_text_sums_to_one_over_token_paths(grammar):
    min_length, max_length = 2, 4
    policy = toy_policy(grammar)
    reference = brute_force(policy, "ab", min_length, max_length)
    texts = all_strings("ab", 2 * max_length)  # every token is at most 2 characters
    result = exact_log_probs(policy, "ab", texts, min_length=min_length, max_length=max_length)
    assert math.exp(np.logaddexp.reduce(result.log_prob)) == pytest.approx(1.0, abs=1e-9)
    emitted = {t for t, lp in zip(texts, result.log_prob, strict=True) if lp > -np.inf}
    assert emitted == set(reference)
    got = np.array([result.log_prob[texts.index(t)] for t in sorted(reference)])
    np.testing.assert_allclose(got, np.log([reference[t] for t in sorted(reference)]), atol=1e-6)
    if grammar is not None:
        assert "a" in emitted  # the dead end stops below min_length, as the sampler does
        assert set(emitted) <= {"a"} | {"ba" + "b" * n for n in range(7)}
    # several token paths spell one text (e.g. "bab" = b,a,b = b,ab): paths outnumber texts
    assert len(result.path_text) > len(emitted)


# one child process: exact log pi of Expr24's 1- and 3-character sentences, as raw float64 bytes
EXACT_IN_A_CHILD = """
import torch
from tests.adapters.test_exact import PROMPT, expr24_policy, short_sentences
from raptb.adapters.lm.exact import exact_log_probs

torch.set_num_threads(1)
result = exact_log_probs(expr24_policy(1, 3), PROMPT, short_sentences(), min_length=1, max_length=3)
print(result.log_prob.tobytes().hex(), result.path_log_prob.tobytes().hex())
"""


def test_exact_log_probs_are_bitwise_equal_under_any_hash_seed():
    """Python's string hash, and so a set's order, changes with PYTHONHASHSEED between processes:
    two children with different seeds must give the same bits (the trie's order is fixed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", EXACT_IN_A_CHILD],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in ("1", "2")
    ]
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (_, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr
    assert outputs[0][0] == outputs[1][0]


def binomial_bound(p: float, n: int, sigmas: float = 4.0) -> float:
    return sigmas * math.sqrt(p * (1 - p) / n) + 1e-12


def test_sampled_frequencies_of_likely_texts_match_exact():
    policy = expr24_policy(1, 3, seed=2)
    sentences = short_sentences()
    exact = np.exp(exact_log_probs(policy, PROMPT, sentences, min_length=1, max_length=3).log_prob)
    n = 4000
    rollout = policy.sample(
        PROMPT, n, min_length=1, max_length=3, generator=torch.Generator().manual_seed(0)
    )
    counts = {t: rollout.texts.count(t) for t in set(rollout.texts)}
    # chosen by exact probability, not by sampled frequency, so no selection bias
    for i in np.argsort(-exact)[:5]:
        p, freq = exact[i], counts.get(sentences[i], 0) / n
        assert abs(freq - p) < binomial_bound(p, n), (sentences[i], freq, p)
    length_one = exact[[len(t) == 1 for t in sentences]].sum()
    freq_one = np.mean([len(t) == 1 for t in rollout.texts])
    assert abs(freq_one - length_one) < binomial_bound(length_one, n)


@pytest.mark.slow
def test_expr24_exact_accuracy_matches_sampling_on_the_embedded_model():
    from raptb.adapters.tasks.expr24.task import enumerate_solutions

    task = Expr24Task()
    policy = expr24_policy(task.min_length, task.max_length, seed=0, scale=1.0)
    solutions = enumerate_solutions()
    result = exact_log_probs(
        policy, task.prompt, solutions, min_length=task.min_length, max_length=task.max_length
    )
    assert np.all(np.isfinite(result.log_prob))  # every solution is reachable
    acc = float(np.exp(result.log_prob).sum())
    n = 6400
    rollout = policy.sample(
        task.prompt,
        n,
        min_length=task.min_length,
        max_length=task.max_length,
        generator=torch.Generator().manual_seed(0),
    )
    hits = sum(task.score(task.prompt, t).value == 1.0 for t in rollout.texts)
    assert abs(hits / n - acc) < binomial_bound(acc, n), (hits / n, acc)
