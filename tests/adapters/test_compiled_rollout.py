"""The compiled rollout loop (adapters/lm/embedded/compiled_rollout.py) against ONNX Runtime's
``rollout`` graph (onnx_graph.rollout_graph, itself held to the column-by-column path and the
reference loop in test_onnx_rollout.py) on the same feeds.

Random GPT-2 weights of random shapes, every activation the graph computes, prompts with
left-padded pads (``key_bias`` -inf), per-row temperatures, an automaton's table with dead ends,
any ``min_length``: the same drawn tokens, the same active and moving rows, log-probabilities and
log-normalisers within float rounding where the caller reads them. The rows come through the
policy in test_onnx_rollout.py (``test_one_call_equals_the_column_loop``, both engines).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.embedded import compiled_rollout, onnx_rollout
from raptb.adapters.lm.embedded.onnx_builder import ACTIVATIONS, weight_shapes
from raptb.adapters.lm.embedded.onnx_graph import ColumnShape, rollout_graph
from raptb.adapters.lm.kv_cache import cache_keyword, returned_cache

TOLERANCE = 1e-5
"""Log-probabilities of magnitude 0.01-20: the two engines' float32 rounding is below 2e-6."""

SCANS = ("tokens", "token_lp", "stop_lp", "log_norm", "active", "moves")


def random_feeds(shape: ColumnShape, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """The rollout graph's feeds: weights N(0, 0.3^2) (layer norms' around 1), prompts of
    ``sizes["prompt"]`` columns whose first slots are pads for some rows, a random automaton of
    ``sizes["states"]`` states (some states allow nothing legal: a dead end), Exp(1) noise."""
    rng = np.random.default_rng(seed)
    n, prompt, columns = sizes["rows"], sizes["prompt"], sizes["columns"]
    heads, dim = shape.n_head, shape.n_embd // shape.n_head
    feeds: dict[str, np.ndarray] = {}
    for name, dims in weight_shapes(shape).items():
        base = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
        feeds[name] = (base + 0.3 * rng.standard_normal(dims)).astype(np.float32)
    for layer in range(shape.n_layer):
        for kv in "kv":
            past = rng.standard_normal((n, heads, prompt, dim))
            feeds[f"past_{kv}{layer}"] = past.astype(np.float32)
    pads = rng.integers(0, prompt, size=n)  # each row sees at least its last prompt column
    key_bias = np.where(np.arange(prompt)[None, :] < pads[:, None], -np.inf, 0.0)
    states, width = sizes["states"], shape.width
    table_mask = rng.random((states, width)) < 0.6
    table_mask[rng.random(states) < 0.2, : width - 1] = False  # dead ends
    feeds |= {
        "logits": (2.0 * rng.standard_normal((n, shape.vocab))).astype(np.float32),
        "key_bias": key_bias.astype(np.float32),
        "positions": (prompt + rng.integers(0, 3, size=n)).astype(np.int64),
        "temperature": rng.uniform(0.5, 2.0, size=(n, 1)).astype(np.float32),
        "noise": rng.exponential(size=(columns, n, width)).astype(np.float32),
        "min_length": np.array(sizes["min_length"], dtype=np.int64),
        "columns": np.array(columns, dtype=np.int64),
        "pad": np.array(shape.vocab - 1, dtype=np.int64),
        "table_mask": table_mask,
        "table_next": rng.integers(0, states, size=(states, width)).astype(np.int64),
    }
    return feeds


@st.composite
def cases(draw: st.DrawFn) -> tuple[ColumnShape, dict[str, int], int]:
    heads, dim = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    vocab = draw(st.integers(4, 24))
    legal = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6, unique=True))
    stop = draw(st.integers(0, vocab - 1).filter(lambda i: i not in legal))
    columns = draw(st.integers(0, 7))
    sizes = {
        "rows": draw(st.integers(1, 7)),
        "prompt": draw(st.integers(1, 4)),
        "columns": columns,
        "min_length": draw(st.integers(0, columns + 1)),
        "states": draw(st.integers(1, 4)),
    }
    shape = ColumnShape(
        n_layer=draw(st.integers(1, 2)),
        n_head=heads,
        n_embd=heads * dim,
        n_inner=draw(st.integers(1, 12)),
        vocab=vocab,
        positions=sizes["prompt"] + columns + 3,
        eps=1e-5,
        sub_ids=(*legal, stop),
        activation=draw(st.sampled_from(sorted(set(ACTIVATIONS.values())))),
    )
    return shape, sizes, draw(st.integers(0, 2**32 - 1))


def graph_outputs(shape: ColumnShape, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnx_rollout.session(rollout_graph(shape), 1).run(None, feeds)


def assert_same_rollout(mine: list[np.ndarray], graph: list[np.ndarray]) -> None:
    """The same draws; the floats within TOLERANCE where the caller reads them (``onnx_rollout``:
    a token's log-probability where the row moved, the stop's and the normaliser where it was
    active, the last stop's where it is still active)."""
    last_stop, last_active, *scans = mine
    graph_stop, graph_active, *graph_scans = graph
    theirs = dict(zip(SCANS, graph_scans, strict=True))
    for name, value in zip(SCANS, scans, strict=True):
        if theirs[name].size == 0:  # no column drawn (T = 0): the graph's scans are [0, 0]
            assert value.size == 0, name
            continue
        assert value.shape == theirs[name].shape, name
        if value.dtype != np.float32:
            assert np.array_equal(value, theirs[name]), name
    np.testing.assert_array_equal(last_active, graph_active)
    read = {"token_lp": theirs["moves"], "stop_lp": theirs["active"], "log_norm": theirs["active"]}
    for name, where in read.items():
        value = dict(zip(SCANS, scans, strict=True))[name]
        np.testing.assert_allclose(value[where], theirs[name][where], rtol=0, atol=TOLERANCE)
    if len(scans[0]) == len(graph_scans[0]) and graph_active.any():
        np.testing.assert_allclose(
            last_stop[graph_active], graph_stop[graph_active], rtol=0, atol=TOLERANCE
        )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_compiled_loop_computes_the_graphs_rollout(
    case: tuple[ColumnShape, dict[str, int], int],
) -> None:
    shape, sizes, seed = case
    feeds = random_feeds(shape, sizes, seed)
    mine = compiled_rollout.run(dict(feeds), shape)
    assert_same_rollout(mine, graph_outputs(shape, feeds))


def test_a_rollout_that_runs_every_column_reads_the_last_stop() -> None:
    """No stop allowed before the last column (``min_length`` = T, every state allows every
    choice): every row is still going after T columns, and the stop's log-probability after the
    last forward is read for all of them."""
    shape = ColumnShape(
        n_layer=2, n_head=2, n_embd=8, n_inner=16, vocab=12, positions=16, eps=1e-5,
        sub_ids=(1, 4, 7, 0),
    )  # fmt: skip
    sizes = {"rows": 5, "prompt": 3, "columns": 6, "min_length": 6, "states": 1}
    feeds = random_feeds(shape, sizes, seed=11)
    feeds["table_mask"] = np.ones((1, shape.width), dtype=bool)
    mine = compiled_rollout.run(dict(feeds), shape)
    graph = graph_outputs(shape, feeds)
    assert mine[1].all() and len(mine[2]) == 6
    assert_same_rollout(mine, graph)
    assert np.all(mine[0] < 0)  # a log-probability, read for every row


HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def transformers_prompt(
    shape: ColumnShape, feeds: dict[str, np.ndarray], prompt_ids: list[int], n: int
) -> dict[str, np.ndarray]:
    """The prompt's last logits and keys and values for ``n`` rows by transformers' own
    GPT2LMHeadModel with ``feeds``' weights (untied head), as the graph takes them."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=shape.vocab, bos_token_id=0, eos_token_id=0, n_positions=shape.positions,
        n_embd=shape.n_embd, n_layer=shape.n_layer, n_head=shape.n_head, n_inner=shape.n_inner,
        activation_function=HF_ACTIVATIONS[shape.activation], layer_norm_epsilon=shape.eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    state = {name: torch.from_numpy(feeds[name]) for name in weight_shapes(shape)}
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
    cache = returned_cache(out, cache_keyword(model))
    prompt = {"logits": out.logits[0, -1].expand(n, -1).contiguous().numpy()}
    for layer in range(shape.n_layer):
        if hasattr(cache, "layers"):  # transformers 5's cache
            keys, values = cache.layers[layer].keys, cache.layers[layer].values
        else:
            keys, values = cache[layer][:2]
        prompt[f"past_k{layer}"] = keys.expand(n, -1, -1, -1).contiguous().numpy()
        prompt[f"past_v{layer}"] = values.expand(n, -1, -1, -1).contiguous().numpy()
    return prompt


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_shared_prompt_runs_in_the_loop_as_transformers_runs_it(
    case: tuple[ColumnShape, dict[str, int], int],
) -> None:
    """``prompt_ids`` (one prompt for every row, its forward computed by the loop, one slot at a
    time) against the graph given that prompt's logits and keys and values by transformers'
    GPT2LMHeadModel of the same weights: the same rollout."""
    shape, sizes, seed = case
    feeds = random_feeds(shape, sizes, seed)
    n, prompt = sizes["rows"], sizes["prompt"]
    prompt_ids = np.random.default_rng(seed).integers(0, shape.vocab, size=prompt).tolist()
    for name in ("logits", *(f"past_{kv}{layer}" for layer in range(shape.n_layer) for kv in "kv")):
        del feeds[name]
    feeds["key_bias"] = np.zeros((n, prompt), dtype=np.float32)
    feeds["positions"] = np.full(n, prompt, dtype=np.int64)
    mine = compiled_rollout.run(feeds | {"prompt_ids": np.array(prompt_ids)}, shape)
    graph = graph_outputs(shape, feeds | transformers_prompt(shape, feeds, prompt_ids, n))
    assert_same_rollout(mine, graph)
