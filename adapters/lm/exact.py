"""Exact behaviour log-probabilities of given texts under ``HFPolicy.sample``'s constraints.

The sampler at temperature 1 draws, at a prefix of k generated tokens, from the model's softmax
restricted to the allowed actions A_k (see ``raptb.adapters.lm.policy``):

    A_k = (legal ∩ grammar-allowed)  ∪  {stop if the grammar accepts the text and k >= min_length}

with stop the only action at k = max_length (probability 1) and stop added wherever nothing else
is allowed (a dead end). The behaviour probability of a token path y_1..y_tau then stop is

    log pi(y) = sum_{k < tau} [z_k(y_{k+1}) - logsumexp_{a in A_k} z_k(a)]
                + [z_tau(stop) - logsumexp_{a in A_tau} z_tau(a)]    (0 when tau = max_length)

with z_k the model's logits after the prompt and y_1..y_k. A text can have several token paths
when the legal vocabulary holds multi-character tokens; pi(text) sums over all of them.

Computation. The token paths that spell a prefix of some query text form a trie; one depth-first
walk with a single grammar matcher (accept on the way down, rollback on the way up) fills each
trie node's mask once, however many texts share that prefix (Expr24's 75,445 solutions have
233,372 distinct prefixes). The whole trie is teacher-forced with tree attention
(``raptb.adapters.lm.tree_forward``), one token per node, in a few batched forward passes; the
log-normalisers over A_k are taken in float64 from the model's float32 logits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raptb.adapters.lm.grammar import compile_grammar
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.tree_forward import tree_logits


@dataclass(frozen=True)
class ExactTimings:
    """Wall-clock seconds: trie and grammar masks, model forwards and normalisation, total."""

    trie_s: float
    model_s: float
    total_s: float


@dataclass(frozen=True)
class ExactLogProbs:
    """Exact behaviour log-probabilities of M query texts and of their P token paths.

    texts: the M query texts, in the caller's order.
    log_prob: float64 [M], log pi(text) summed over token paths (-inf: the sampler never emits it).
    path_text: int64 [P], index into ``texts`` of each token path that spells a query text.
    path_length: int64 [P], tokens before the stop (tau) of each path.
    path_log_prob: float64 [P], log pi of each path (stop included; may be -inf).
    """

    texts: list[str]
    log_prob: np.ndarray
    path_text: np.ndarray
    path_length: np.ndarray
    path_log_prob: np.ndarray
    timings: ExactTimings


@dataclass
class _Trie:
    """Token-path trie in depth-first preorder (node 0 is the empty path).

    parent: int64 [N] (-1 at the root); token: int64 [N] sub-vocabulary id of the last token (-1 at
    the root); depth: int64 [N]; mask: int32 [N, W] xgrammar bitmask over the L legal tokens and
    stop (column L) before the length rules (empty at depth max_length); text: what each node
    spells.
    """

    parent: np.ndarray
    token: np.ndarray
    depth: np.ndarray
    mask: np.ndarray
    text: list[str]


def _char_children(texts: Sequence[str]) -> dict[str, list[str]]:
    """For every prefix of ``texts``, the characters that extend it to another prefix, in
    code-point order.

    Sorted, not a set's order: that follows Python's per-process string hash, and the trie's
    node order decides how the tree forwards batch and round, so log pi would differ between
    processes in the last float32 bits.
    """
    prefixes = sorted({text[:k] for text in texts for k in range(len(text) + 1)})
    children: dict[str, list[str]] = {prefix: [] for prefix in prefixes}
    for prefix in prefixes:
        if prefix:
            children[prefix[:-1]].append(prefix[-1])
    return children


def _continuations(
    text: str, children: dict[str, list[str]], by_text: dict[str, list[int]], longest: int
) -> list[int]:
    """Sub-ids of the legal tokens whose text extends ``text`` to a prefix of a query text."""
    found: list[int] = []
    frontier = [text]
    for _ in range(longest):
        frontier = [s + c for s in frontier for c in children.get(s, ())]
        for s in frontier:
            found.extend(by_text.get(s[len(text) :], ()))
    return found


def _build_trie(policy: HFPolicy, texts: Sequence[str], max_length: int) -> _Trie:
    """Walk every token path spelling a prefix of a query text, filling each node's mask once.

    Nodes at depth ``max_length`` need no mask (stop is forced there) and get an empty one; the
    matcher never visits them, which spares a third of Expr24's grammar calls.
    """
    num_legal = len(policy.legal_ids)
    words = (num_legal + 1 + 31) // 32
    by_text: dict[str, list[int]] = {}
    for sub, token_text in enumerate(policy.texts):
        if token_text:
            by_text.setdefault(token_text, []).append(sub)
    longest = max(len(t) for t in by_text)
    children = _char_children(texts)
    import xgrammar as xgr  # at use: the CLI's start does not import it

    matcher = None
    if policy.grammar is not None:
        matcher = xgr.GrammarMatcher(compile_grammar(tuple(policy.texts), policy.grammar))
    bitmask = xgr.allocate_token_bitmask(1, num_legal + 1)
    everything = [-1] * words  # no grammar: every action allowed, the text always complete
    nothing = [0] * words

    parent: list[int] = []
    token: list[int] = []
    depth: list[int] = []
    masks: list[list[int]] = []
    node_text: list[str] = []
    # entries: (parent node, sub-id of the last token, depth, text); None rolls the matcher back
    stack: list[tuple[int, int, int, str] | None] = [(-1, -1, 0, "")]
    while stack:
        entry = stack.pop()
        if entry is None:
            assert matcher is not None
            matcher.rollback(1)
            continue
        up, sub, k, text = entry
        node = len(parent)
        parent.append(up)
        token.append(sub)
        depth.append(k)
        node_text.append(text)
        if k == max_length:
            masks.append(nothing)
            continue
        if matcher is None:
            mask = everything
        else:
            if sub >= 0:
                if not matcher.accept_token(sub):
                    raise RuntimeError("grammar matcher rejected a token its own mask allowed")
                stack.append(None)  # popped after the whole subtree: undo this token
            matcher.fill_next_token_bitmask(bitmask, 0)
            mask = bitmask[0].tolist()
        masks.append(mask)
        for child in reversed(_continuations(text, children, by_text, longest)):
            if (mask[child // 32] >> (child % 32)) & 1:
                stack.append((node, child, k + 1, text + policy.texts[child]))
    return _Trie(
        parent=np.asarray(parent, dtype=np.int64),
        token=np.asarray(token, dtype=np.int64),
        depth=np.asarray(depth, dtype=np.int64),
        mask=np.asarray(masks, dtype=np.int32),
        text=node_text,
    )


def _unpack(words: np.ndarray, num_legal: int) -> np.ndarray:
    """Bool [n, L + 1] from xgrammar int32 bitmask rows [n, W] (bit j % 32 of word j // 32)."""
    bits = (words.view(np.uint32)[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1
    return bits.reshape(words.shape[0], -1)[:, : num_legal + 1].astype(bool)


def _action_mask(trie: _Trie, num_legal: int, min_length: int, max_length: int) -> np.ndarray:
    """Bool [N, L + 1] allowed actions A_k at every node (module docstring; column L is stop)."""
    mask = _unpack(trie.mask, num_legal)
    k = trie.depth
    legal = mask[:, :num_legal] & (k < max_length)[:, None]
    can_stop = (mask[:, num_legal] & (k >= min_length)) | ~legal.any(axis=1)
    return np.concatenate([legal, can_stop[:, None]], axis=1)


def exact_log_probs(
    policy: HFPolicy,
    prompt: str,
    texts: Sequence[str],
    *,
    min_length: int,
    max_length: int,
) -> ExactLogProbs:
    """Exact log pi(text) of the temperature-1 sampler for every query text (module docstring).

    Texts longer than any token path the sampler can take, or off the grammar, get -inf.
    """
    if not 0 <= min_length <= max_length:
        raise ValueError(
            f"min_length, max_length: need 0 <= min_length <= max_length, got "
            f"{min_length}, {max_length}"
        )
    policy.check_positions(len(policy.prompt_ids(prompt)), max_length)
    start = time.perf_counter()
    texts = list(texts)
    trie = _build_trie(policy, texts, max_length)
    trie_s = time.perf_counter() - start

    tic = time.perf_counter()
    edge_lp, stop_lp = _step_log_probs(policy, prompt, trie, min_length, max_length)
    model_s = time.perf_counter() - tic

    cum = np.zeros(len(trie.parent))
    for k in range(1, int(trie.depth.max()) + 1):
        at = np.flatnonzero(trie.depth == k)
        cum[at] = cum[trie.parent[at]] + edge_lp[at]
    index = {text: i for i, text in enumerate(texts)}
    ends = np.array([n for n, t in enumerate(trie.text) if t in index], dtype=np.int64)
    path_text = np.array([index[trie.text[n]] for n in ends], dtype=np.int64)
    path_log_prob = cum[ends] + stop_lp[ends]
    log_prob = np.full(len(texts), -np.inf)
    np.logaddexp.at(log_prob, path_text, path_log_prob)
    return ExactLogProbs(
        texts=texts,
        log_prob=log_prob,
        path_text=path_text,
        path_length=trie.depth[ends],
        path_log_prob=path_log_prob,
        timings=ExactTimings(trie_s, model_s, time.perf_counter() - start),
    )


def _step_log_probs(
    policy: HFPolicy, prompt: str, trie: _Trie, min_length: int, max_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per node: float64 log-prob of the edge from its parent (0 at the root) and of stopping
    there (-inf where stop is not allowed, 0 where it is forced)."""
    num_legal = len(policy.legal_ids)
    legal = np.asarray(policy.legal_ids, dtype=np.int64)
    sub_logits = tree_logits(
        policy.model,
        policy.prompt_ids(prompt),
        np.where(trie.token >= 0, legal[np.maximum(trie.token, 0)], policy.stop_id),
        trie.parent,
        trie.depth,
        [*policy.legal_ids, policy.stop_id],
    ).astype(np.float64)
    allowed = _action_mask(trie, num_legal, min_length, max_length)
    masked = np.where(allowed, sub_logits, -np.inf)
    top = masked.max(axis=1, keepdims=True)  # finite: every node allows at least stop
    log_norm = top[:, 0] + np.log(np.exp(masked - top).sum(axis=1))
    forced = trie.depth == max_length
    stop_lp = np.where(allowed[:, num_legal], sub_logits[:, num_legal] - log_norm, -np.inf)
    stop_lp[forced] = 0.0
    edge_lp = np.zeros(len(trie.parent))
    up = trie.parent[1:]
    edge_lp[1:] = sub_logits[up, trie.token[1:]] - log_norm[up]
    return edge_lp, stop_lp
