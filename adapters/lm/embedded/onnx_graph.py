"""The rollout as ONNX graphs: GPT-2's one-token forward and the behaviour's draw, one column
or all of them.

For the embedded model (2 blocks, width 64) a rollout column is about 60 torch operations of the
forward and 20 of the sampling, each 2-20 us of dispatch on a CPU core for microseconds of
arithmetic; ONNX Runtime runs the same graph from C++ in one call. Three graphs, built from the
model's configuration only with ``onnx_builder``'s pieces (its weights are inputs, bound to the
parameters' memory at each rollout, so the graph follows the optimizer's in-place updates):

``sample`` (the first column, after the prompt): from ``logits`` [n, V]

    behaviour = where(mask, logits[:, sub_ids] / temperature, -inf)     mask: bool [n, K]
    choice    = argmax(softmax(behaviour) / noise)                      noise: Exp(1) [n, K]
    token_lp  = logits[sub_ids[choice]] - logsumexp(logits)             untempered, unmasked
    stop_lp   = logits[stop_id] - logsumexp(logits)

``argmax(p / q)`` with q ~ Exp(1) drawn by torch is torch.multinomial's own draw of one sample
(aten's multinomial: ``q = empty_like(p).exponential_(1, gen); argmax(p / q)``), so a generator
gives the rows the same choices on both paths, up to a tie within float rounding.

``step`` (every later column): GPT-2's forward of each row's last token ``tokens`` [n] at
``positions`` [n] over the keys and values ``past_k{l}``, ``past_v{l}`` [n, H, S, D] of the
columns before, ``key_bias`` [n, S + 1] added to every head's scores (0, or -inf on a left-padded
prompt's pads; the new column's 0) (``raptb.adapters.lm.embedded.lean_gpt2.forward``'s function with
its ``key_mask``, the same operations in ONNX's names), then ``sample`` on its logits; it also
returns the keys and values with the new column.

``rollout`` (``rollout_graph``): every column after the prompt in one ONNX ``Loop`` of
``sample``'s draw and ``step``'s forward, each row's mask read from a grammar automaton's table
by its state.

``stop_lp`` and ``token_lp`` are computed as ``rollout_record.token_log_probs`` computes them (a
gathered logit minus the log-normaliser), ``log_norm`` is returned so that the caller can refuse
a non-finite distribution as torch.multinomial does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from raptb.adapters.lm.embedded.onnx_builder import (
    GraphBuilder,
    ModelShape,
    activation,
    weight_shapes,
)


@dataclass(frozen=True)
class ColumnShape(ModelShape):
    """The column graphs' shape: the model's and the behaviour's sub-vocabulary."""

    sub_ids: tuple[int, ...] = field(kw_only=True)
    """Full-vocabulary ids of the behaviour's K choices (the legal tokens, then stop)."""

    @property
    def stop_id(self) -> int:
        """The stop's id: the last choice."""
        return self.sub_ids[-1]

    @property
    def width(self) -> int:
        return len(self.sub_ids)


def _column(
    b: GraphBuilder,
    shape: ColumnShape,
    tokens: str,
    positions: str,
    key_bias: str,
    past: Sequence[tuple[str, str]],
) -> tuple[str, list[tuple[str, str]]]:
    """GPT-2's forward of each row's last token ``tokens`` [n] at ``positions`` [n] over each
    layer's keys and values ``past`` [n, H, S, D], ``key_bias`` [n, S + 1] added to every head's
    scores (the weights read by name): the logits [n, V] and each layer's keys and values with
    the new column."""
    c, heads = shape.n_embd, shape.n_head
    head = c // heads
    bias = b.one("Unsqueeze", [key_bias, b.constant("head_axes", np.array([1, 2], np.int64))])
    as_heads = b.constant("as_heads", np.array([-1, heads, 1, head], np.int64))
    as_rows = b.constant("as_rows", np.array([-1, c], np.int64))
    thirds = b.constant("thirds", np.array([c, c, c], np.int64))
    scale = b.constant("scale", np.array(head**-0.5, np.float32))
    h = b.one(
        "Add",
        [
            b.one("Gather", ["transformer.wte.weight", tokens]),
            b.one("Gather", ["transformer.wpe.weight", positions]),
        ],
    )
    presents = []
    for layer, (past_k, past_v) in enumerate(past):
        p = f"transformer.h.{layer}."
        x = b.one("LayerNormalization", [h, p + "ln_1.weight", p + "ln_1.bias"], epsilon=shape.eps)
        qkv = b.one("Gemm", [x, p + "attn.c_attn.weight", p + "attn.c_attn.bias"])
        q, k, v = (b.one("Reshape", [t, as_heads]) for t in b.op("Split", [qkv, thirds], 3, axis=1))
        keys = b.one("Concat", [past_k, k], axis=2)
        values = b.one("Concat", [past_v, v], axis=2)
        presents.append((keys, values))
        scores = b.one(
            "MatMul", [b.one("Mul", [q, scale]), b.one("Transpose", [keys], perm=[0, 1, 3, 2])]
        )
        scores = b.one("Add", [scores, bias])  # [n, H, 1, S + 1] + [n, 1, 1, S + 1]
        y = b.one("MatMul", [b.one("Softmax", [scores], axis=-1), values])
        y = b.one("Reshape", [y, as_rows])
        h = b.one("Add", [h, b.one("Gemm", [y, p + "attn.c_proj.weight", p + "attn.c_proj.bias"])])
        x = b.one("LayerNormalization", [h, p + "ln_2.weight", p + "ln_2.bias"], epsilon=shape.eps)
        m = activation(
            b, shape.activation, b.one("Gemm", [x, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias"])
        )
        h = b.one("Add", [h, b.one("Gemm", [m, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias"])])
    x = b.one(
        "LayerNormalization",
        [h, "transformer.ln_f.weight", "transformer.ln_f.bias"],
        epsilon=shape.eps,
    )
    return b.one("Gemm", [x, "lm_head.weight"], transB=1), presents


def _forward(b: GraphBuilder, shape: ColumnShape) -> str:
    """``_column`` with its inputs declared (``tokens``, ``positions``, the weights,
    ``key_bias``, ``past_k{l}``, ``past_v{l}``) and the new keys and values as outputs
    ``present_k{l}``, ``present_v{l}``: the logits [n, V]."""
    from onnx import TensorProto

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    heads, head = shape.n_head, shape.n_embd // shape.n_head
    tokens = b.input("tokens", i64, ["n"])
    positions = b.input("positions", i64, ["n"])
    for name, dims in weight_shapes(shape).items():
        b.input(name, f32, dims)
    key_bias = b.input("key_bias", f32, ["n", "s1"])
    past = [
        (
            b.input(f"past_k{layer}", f32, ["n", heads, "s", head]),
            b.input(f"past_v{layer}", f32, ["n", heads, "s", head]),
        )
        for layer in range(shape.n_layer)
    ]
    logits, presents = _column(b, shape, tokens, positions, key_bias, past)
    for layer, (keys, values) in enumerate(presents):
        b.output(keys, f"present_k{layer}", f32, ["n", heads, "s1", head])
        b.output(values, f"present_v{layer}", f32, ["n", heads, "s1", head])
    return logits


def _draw(
    b: GraphBuilder, shape: ColumnShape, logits: str, mask: str, temperature: str, noise: str
) -> tuple[str, str, str, str]:
    """The behaviour's draw and the log-probabilities (module docstring) on ``logits`` [n, V]:
    ``choice``, ``token_lp``, ``stop_lp``, ``log_norm``, each [n]."""
    sub_ids = b.constant("sub_ids", np.array(shape.sub_ids, np.int64))
    minus_inf = b.constant("minus_inf", np.array(-np.inf, np.float32))
    sub = b.one("Gather", [logits, sub_ids], axis=1)
    behaviour = b.one("Where", [mask, b.one("Div", [sub, temperature]), minus_inf])
    chances = b.one("Div", [b.one("Softmax", [behaviour], axis=1), noise])
    choice = b.one("ArgMax", [chances], axis=1, keepdims=1)  # [n, 1], the first of ties
    stop_lp, log_norm = _stop_log_prob(b, shape, logits)
    token = b.one("Sub", [b.one("GatherElements", [sub, choice], axis=1), log_norm])
    return tuple(_flat(b, t) for t in (choice, token, stop_lp, log_norm))


def _stop_log_prob(b: GraphBuilder, shape: ColumnShape, logits: str) -> tuple[str, str]:
    """The stop's log-probability and the log-normaliser under ``logits`` [n, V], each [n, 1]."""
    stop = b.constant("stop", np.array([shape.stop_id], np.int64))
    log_norm = b.one("ReduceLogSumExp", [logits, b.constant("last", np.array([1], np.int64))])
    return b.one("Sub", [b.one("Gather", [logits, stop], axis=1), log_norm]), log_norm


def _flat(b: GraphBuilder, x: str) -> str:
    """``x`` [n, 1] as [n]."""
    return b.one("Reshape", [x, b.value(np.array([-1], np.int64))])


def _sample(b: GraphBuilder, shape: ColumnShape, logits: str) -> None:
    """``_draw`` with its inputs declared (``mask``, ``temperature``, ``noise``) and its four
    results as outputs of their names."""
    from onnx import TensorProto

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    k = shape.width
    mask = b.input("mask", TensorProto.BOOL, ["n", k])
    temperature = b.input("temperature", f32, ["n", 1])
    noise = b.input("noise", f32, ["n", k])
    drawn = _draw(b, shape, logits, mask, temperature, noise)
    for name, dtype, value in zip(_DRAWN, (i64, f32, f32, f32), drawn, strict=True):
        b.output(value, name, dtype, ["n"])


_DRAWN = ("choice", "token_lp", "stop_lp", "log_norm")


def sample_graph(shape: ColumnShape) -> bytes:
    """The serialised ``sample`` graph (module docstring): inputs ``logits`` [n, V], ``mask``,
    ``temperature``, ``noise``."""
    from onnx import TensorProto

    b = GraphBuilder()
    logits = b.input("logits", TensorProto.FLOAT, ["n", shape.vocab])
    _sample(b, shape, logits)
    return b.model("sample")


def step_graph(shape: ColumnShape) -> bytes:
    """The serialised ``step`` graph (module docstring): the forward's inputs (``tokens``,
    ``positions``, ``key_bias``, the weights, ``past_k{l}``, ``past_v{l}``), then ``sample``'s but
    ``logits``;
    outputs ``present_k{l}``, ``present_v{l}`` and ``sample``'s (read them by name)."""
    b = GraphBuilder()
    _sample(b, shape, _forward(b, shape))
    return b.model("step")


def rollout_graph(shape: ColumnShape) -> bytes:
    """The serialised ``rollout`` graph: a whole rollout's columns after the prompt in one
    ONNX ``Loop``, the grammar an automaton's table (``core.char_automaton.TokenTable``) inside it.

    Inputs: the weights; ``logits`` [n, V] after the prompts and their keys and values
    ``past_k{l}``, ``past_v{l}``, ``key_bias`` [n, S] and ``positions`` [n] (each row's next
    position), as ``step`` takes them; ``temperature`` [n, 1]; ``noise`` [T, n, K] (column k's
    Exp(1) noise, drawn as ``sample`` takes it); ``min_length``, ``columns`` (T) and ``pad`` (the
    pad id), int64 scalars; the table ``table_mask`` bool [S, K] and ``table_next`` int64 [S, K]
    (the state after each choice; the stop's column any state).

    Iteration k (0 <= k < T) draws column k as ``sample`` does, its mask the row's state's row of
    the table and the host's rules of ``onnx_rollout`` (a finished row may only stop, no stop
    below ``min_length``, a dead end stops), moves the rows that did not stop to their next state,
    and runs ``step``'s forward of the drawn tokens (a stopped row's is ``pad``): the next
    iteration's logits. It stops after a column where no row moved. Scan outputs, [iterations, n]:
    ``tokens`` (``pad`` where the row did not move), ``token_lp``, ``stop_lp``, ``log_norm``,
    ``active`` (the rows still going before the draw), ``moves``; then ``last_stop_lp`` [n], the
    stop's log-probability after the last iteration (column T's when the loop ran T columns) and
    ``last_active`` [n]."""
    from onnx import TensorProto, helper

    f32, i64, boolean = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    heads, head, k_width = shape.n_head, shape.n_embd // shape.n_head, shape.width
    outer = GraphBuilder(prefix="outer_")
    for name, dims in weight_shapes(shape).items():
        outer.input(name, f32, dims)
    logits = outer.input("logits", f32, ["n", shape.vocab])
    past = [
        (
            outer.input(f"past_k{layer}", f32, ["n", heads, "s", head]),
            outer.input(f"past_v{layer}", f32, ["n", heads, "s", head]),
        )
        for layer in range(shape.n_layer)
    ]
    key_bias = outer.input("key_bias", f32, ["n", "s"])
    positions = outer.input("positions", i64, ["n"])
    outer.input("temperature", f32, ["n", 1])
    outer.input("noise", f32, ["t", "n", k_width])
    outer.input("min_length", i64, [])
    columns = outer.input("columns", i64, [])
    outer.input("pad", i64, [])
    outer.input("table_mask", boolean, ["states", k_width])
    outer.input("table_next", i64, ["states", k_width])

    body = GraphBuilder(prefix="body_")
    step = body.input("k", i64, [])
    body.input("cond_in", boolean, [])
    carried = [
        body.input("logits_in", f32, ["n", shape.vocab]),
        body.input("active_in", boolean, ["n"]),
        body.input("state_in", i64, ["n"]),
        body.input("key_bias_in", f32, ["n", "s"]),
        body.input("positions_in", i64, ["n"]),
    ]
    for layer in range(shape.n_layer):
        carried.append(body.input(f"past_k{layer}_in", f32, ["n", heads, "s", head]))
        carried.append(body.input(f"past_v{layer}_in", f32, ["n", heads, "s", head]))
    b_logits, active, state, b_bias, b_positions = carried[:5]
    b_past = list(zip(carried[5::2], carried[6::2], strict=True))
    num_legal = k_width - 1
    one = body.constant("one", np.array([1], np.int64))

    def any_true(x: str, keepdims: int) -> str:
        """Whether any entry of bool ``x`` is true: in each row ([n, 1]), or at all ([])."""
        axes = [one] if keepdims else []  # (ONNX reduces no bools)
        most = body.one(
            "ReduceMax", [body.one("Cast", [x], to=TensorProto.INT32), *axes], keepdims=keepdims
        )
        return body.one("Greater", [most, body.value(np.array(0, np.int32))])

    def columns_of(mask: str, start: int, stop: int) -> str:
        bounds = [body.value(np.array([start], np.int64)), body.value(np.array([stop], np.int64))]
        return body.one("Slice", [mask, *bounds, one])

    # the mask: the state's row of the table, a finished row only stopping, no stop below
    # min_length, a dead end (nothing legal) stopping
    mask = body.one("Gather", ["table_mask", state], axis=0)
    going = body.one("Unsqueeze", [active, one])
    legal = body.one("And", [columns_of(mask, 0, num_legal), going])
    stop_column = columns_of(mask, num_legal, k_width)
    may_stop = body.one("Not", [body.one("Less", [step, "min_length"])])
    any_legal = any_true(legal, keepdims=1)
    stop_allowed = body.one(
        "Or",
        [
            body.one("And", [stop_column, body.one("And", [may_stop, going])]),
            body.one("Not", [any_legal]),
        ],
    )
    full_mask = body.one("Concat", [legal, stop_allowed], axis=1)
    noise = body.one("Gather", ["noise", step], axis=0)
    choice, token_lp, stop_lp, log_norm = _draw(
        body, shape, b_logits, full_mask, "temperature", noise
    )
    stops = body.one(
        "And", [active, body.one("Equal", [choice, body.value(np.array(num_legal, np.int64))])]
    )
    moves = body.one("And", [active, body.one("Not", [stops])])
    sub_ids = body.constant("choice_ids", np.array(shape.sub_ids, np.int64))
    tokens = body.one("Where", [moves, body.one("Gather", [sub_ids, choice]), "pad"])
    flat_next = body.one("Reshape", ["table_next", body.value(np.array([-1], np.int64))])
    reached = body.one(
        "Gather",
        [
            flat_next,
            body.one(
                "Add",
                [body.one("Mul", [state, body.value(np.array(k_width, np.int64))]), choice],
            ),
        ],
    )
    next_state = body.one("Where", [moves, reached, state])
    zeros = body.one(
        "Expand",
        [
            body.value(np.zeros((1, 1), np.float32)),
            body.one(
                "Concat",
                [body.one("Shape", [b_positions]), body.value(np.array([1], np.int64))],
                axis=0,
            ),
        ],
    )
    next_bias = body.one("Concat", [b_bias, zeros], axis=1)
    next_logits, presents = _column(body, shape, tokens, b_positions, next_bias, b_past)
    next_positions = body.one("Add", [b_positions, body.value(np.array(1, np.int64))])
    cond_out = any_true(moves, keepdims=0)
    body.output(cond_out, "cond_out", boolean, [])
    body.output(next_logits, "logits_out", f32, ["n", shape.vocab])
    body.output(moves, "active_out", boolean, ["n"])
    body.output(next_state, "state_out", i64, ["n"])
    body.output(next_bias, "key_bias_out", f32, ["n", "s1"])
    body.output(next_positions, "positions_out", i64, ["n"])
    for layer, (keys, values) in enumerate(presents):
        body.output(keys, f"past_k{layer}_out", f32, ["n", heads, "s1", head])
        body.output(values, f"past_v{layer}_out", f32, ["n", heads, "s1", head])
    scans = (
        (tokens, "tokens_scan", i64),
        (token_lp, "token_lp_scan", f32),
        (stop_lp, "stop_lp_scan", f32),
        (log_norm, "log_norm_scan", f32),
        (active, "active_scan", boolean),
        (moves, "moves_scan", boolean),
    )
    for value, name, dtype in scans:
        body.output(value, name, dtype, ["n"])

    active0 = outer.one("Expand", [outer.value(np.array([True])), outer.one("Shape", [positions])])
    state0 = outer.one(
        "Expand", [outer.value(np.array([0], np.int64)), outer.one("Shape", [positions])]
    )
    starts = [logits, active0, state0, key_bias, positions]
    for keys, values in past:
        starts += [keys, values]
    finals = [f"final_{i}" for i in range(len(starts))]
    scanned = [name.replace("_scan", "") for _, name, _ in scans]
    outer.nodes.append(
        helper.make_node(
            "Loop",
            [columns, outer.value(np.array(True)), *starts],
            [*finals, *scanned],
            body=body.graph("column"),
        )
    )
    last_stop = _flat(outer, _stop_log_prob(outer, shape, finals[0])[0])
    outer.output(last_stop, "last_stop_lp", f32, ["n"])
    outer.output(finals[1], "last_active", boolean, ["n"])
    for (_, _, dtype), name in zip(scans, scanned, strict=True):
        outer.output(name, f"{name}_out", dtype, ["t", "n"])
    return outer.model("rollout")
