"""The rescoring in ONNX Runtime, forward and backward: a measured lever that does not pay.

The main job's rescoring (``lean_gpt2.shared_prompt_logits`` then
``rollout_record.token_log_probs``: rows sharing one prompt, teacher-forced, with gradients) as
two ONNX graphs built from the model's configuration, with the gradient written out by hand, run
by a ``torch.autograd.Function`` (forward graph in ``forward``, keeping the activations it returns;
backward graph in ``backward``, handing torch each parameter's gradient). The rollout's column
took 1.3-1.4x less time this way (adapters/lm/embedded/onnx_rollout.py at b9cd778, since replaced
by the compiled rollout); this script measures
whether the rescoring does too, against torch's autograd on the same rows (benchmarks/step_speed.md,
"The rescoring in ONNX Runtime").

The graphs, ``forward``: inputs the weights (as ``GPT2LMHeadModel.named_parameters`` names them;
``lm_head.weight`` only when it is not ``wte``'s), ``ids`` and ``positions`` [N = P + B T] (the
prompt's, then the rows' one after another), the additive causal masks ``prompt_bias`` [P, P]
and ``row_bias`` [T, T] (0 or -inf), ``pick`` [2, B, T + 1, 2] (the read-out row and the token of
each log-probability, the second half at the stop) and ``temperature`` []:

    h_0 = wte[ids] + wpe[positions]
    per block: x = ln_1(h); q k v = x W_a + b_a;  q scaled by d_head^-1/2
        prompt:  y_p = softmax(q_p k_p^T + prompt_bias) v_p                       per head
        rows:    y_b = softmax([q_b k_p^T, q_b k_b^T + row_bias]) [v_p; v_b]      per row and head
        a = h + y W_p + b_p;  h' = a + act(ln_2(a) W_fc + b_fc) W_proj + b_proj
    log p = log_softmax(ln_f(h[P - 1:]) W_head^T / temperature)   rows: the prompt's last, B T
    log_probs = log p[pick]                                          [2, B, T + 1]

and every activation the backward reads (``saved_names``). ``backward``: the weights, the saved
activations, ``ids``, ``positions``, ``pick``, ``temperature`` and ``grad`` [2, B, T + 1] (the
loss's gradient with respect to ``log_probs``), to ``grad.<weight name>`` for every weight: the
chain rule through each operation above (layer norm, softmax, the activation, the products, the
embeddings' scatter-add; ``wte``'s two uses summed when the head is tied).

Usage (from the repository root):

    python benchmarks/onnx_rescoring.py check [--rows 97 --width 9]
    python benchmarks/onnx_rescoring.py time [--rows 97 --width 9 --rounds 5 --reps 40]
    python benchmarks/onnx_rescoring.py ops [--rows 97 --width 9 --reps 40]

``check`` prints the largest differences of the log-probabilities and of every parameter's
gradient (relative to its largest entry) against torch's autograd, on the embedded model with
every parameter moved off its initialisation; ``time`` the forward, backward and both of each
path, the two alternating round by round on one thread; ``ops`` ONNX Runtime's own profile of
the two graphs, kernel time by operator type.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from onnx_builder import (
    ACTIVATIONS,
    GraphBuilder,
    ModelShape,
    activation,
    session,
    weight_names,
    weight_shapes,
)

BIG = np.array([2**62], np.int64)
"""A slice's open end."""


@dataclass(frozen=True)
class ScoreShape(ModelShape):
    """The graphs' shape: the model's configuration, and whether its head is tied."""

    tied: bool = True
    """Whether the head's weight is ``wte``'s (GPT-2's default)."""


def score_weight_names(shape: ScoreShape) -> list[str]:
    """The graphs' weight inputs (``lm_head.weight`` only when untied)."""
    names = weight_names(shape)
    return names[:-1] if shape.tied else names


def _head(shape: ScoreShape) -> str:
    return "transformer.wte.weight" if shape.tied else "lm_head.weight"


_BLOCK_SAVED = (
    "h", "mu1", "rs1", "x1", "qp", "kp", "vp", "qb", "kb", "vb", "sp", "sb",
    "y", "a", "mu2", "rs2", "x2", "u", "m",
)  # fmt: skip
_FINAL_SAVED = ("hf", "muf", "rsf", "z", "logp")


_RANKS = {"qp": 3, "kp": 3, "vp": 3, "sp": 3, "qb": 4, "kb": 4, "vb": 4, "sb": 4}
"""The saved activations' ranks (2 for the others: [tokens, features] or [tokens, 1])."""


def _saved_dims(name: str) -> list[str]:
    rank = _RANKS.get(name.rstrip("0123456789"), 2)
    return [f"{name}_{axis}" for axis in range(rank)]


def saved_names(shape: ScoreShape) -> list[str]:
    """The activations ``forward`` hands to ``backward``, in order."""
    names = [f"{name}{layer}" for layer in range(shape.n_layer) for name in _BLOCK_SAVED]
    return names + list(_FINAL_SAVED)


class _Layout:
    """Slicing and head reshapes shared by the two graphs; P and T read from tensors' shapes."""

    def __init__(self, b: GraphBuilder, shape: ScoreShape, prompt_len: str, row_len: str):
        self.b = b
        heads, c = shape.n_head, shape.n_embd
        self.p = prompt_len  # [1] int64
        self.zero = b.value(np.array([0], np.int64))
        self.big = b.value(BIG)
        self.first_axis = b.value(np.array([0], np.int64))
        self.last_axis = b.value(np.array([-1], np.int64))
        self.as_prompt_heads = b.value(np.array([-1, heads, c // heads], np.int64))
        self.as_rows = b.value(np.array([-1, c], np.int64))
        minus_one = b.value(np.array([-1], np.int64))
        fixed = b.value(np.array([heads, c // heads], np.int64))
        self.as_row_heads = b.one("Concat", [minus_one, row_len, fixed], axis=0)

    def prompt(self, x: str, axis: str | None = None) -> str:
        """x's first P entries along ``axis`` (the first by default)."""
        return self.b.one("Slice", [x, self.zero, self.p, axis or self.first_axis])

    def rows(self, x: str, axis: str | None = None) -> str:
        """x's entries from P on along ``axis``."""
        return self.b.one("Slice", [x, self.p, self.big, axis or self.first_axis])

    def prompt_heads(self, x: str) -> str:
        """[P, C] -> [H, P, D]."""
        return self.b.one(
            "Transpose", [self.b.one("Reshape", [x, self.as_prompt_heads])], perm=[1, 0, 2]
        )

    def row_heads(self, x: str) -> str:
        """[B T, C] -> [B, H, T, D]."""
        return self.b.one(
            "Transpose", [self.b.one("Reshape", [x, self.as_row_heads])], perm=[0, 2, 1, 3]
        )

    def tokens(self, prompt: str, rows: str) -> str:
        """[H, P, D] and [B, H, T, D] -> [P + B T, C]."""
        b = self.b
        p = b.one("Reshape", [b.one("Transpose", [prompt], perm=[1, 0, 2]), self.as_rows])
        r = b.one("Reshape", [b.one("Transpose", [rows], perm=[0, 2, 1, 3]), self.as_rows])
        return b.one("Concat", [p, r], axis=0)


def _weights(b: GraphBuilder, shape: ScoreShape) -> None:
    from onnx import TensorProto

    dims = weight_shapes(shape)
    for name in score_weight_names(shape):
        b.input(name, TensorProto.FLOAT, dims[name])


def _common_inputs(b: GraphBuilder) -> None:
    from onnx import TensorProto

    b.input("ids", TensorProto.INT64, ["N"])
    b.input("positions", TensorProto.INT64, ["N"])
    b.input("pick", TensorProto.INT64, [2, "B", "T1", 2])
    b.input("temperature", TensorProto.FLOAT, [])


def forward_graph(shape: ScoreShape) -> bytes:
    """The serialised ``forward`` graph (module docstring)."""
    from onnx import TensorProto

    f32 = TensorProto.FLOAT
    b = GraphBuilder()
    _weights(b, shape)
    _common_inputs(b)
    prompt_bias = b.input("prompt_bias", f32, ["P", "P"])
    row_bias = b.input("row_bias", f32, ["T", "T"])
    lay = _Layout(
        b,
        shape,
        b.one("Shape", [prompt_bias], start=0, end=1),
        b.one("Shape", [row_bias], start=0, end=1),
    )
    c = shape.n_embd
    thirds = b.value(np.array([c, c, c], np.int64))
    scale = b.value(np.array((c // shape.n_head) ** -0.5, np.float32))
    saved: dict[str, str] = {}
    h = b.one(
        "Add",
        [
            b.one("Gather", ["transformer.wte.weight", "ids"]),
            b.one("Gather", ["transformer.wpe.weight", "positions"]),
        ],
    )
    for layer in range(shape.n_layer):
        w = f"transformer.h.{layer}."
        x1, mu1, rs1 = b.op(
            "LayerNormalization", [h, w + "ln_1.weight", w + "ln_1.bias"], 3, epsilon=shape.eps
        )
        qkv = b.one("Gemm", [x1, w + "attn.c_attn.weight", w + "attn.c_attn.bias"])
        q, k, v = b.op("Split", [qkv, thirds], 3, axis=1)
        q = b.one("Mul", [q, scale])
        qp, kp, vp = (lay.prompt_heads(lay.prompt(t)) for t in (q, k, v))
        qb, kb, vb = (lay.row_heads(lay.rows(t)) for t in (q, k, v))
        kp_t = b.one("Transpose", [kp], perm=[0, 2, 1])
        sp = b.one("Softmax", [b.one("Add", [b.one("MatMul", [qp, kp_t]), prompt_bias])], axis=-1)
        rows_own = b.one("MatMul", [qb, b.one("Transpose", [kb], perm=[0, 1, 3, 2])])
        scores = b.one(
            "Concat", [b.one("MatMul", [qb, kp_t]), b.one("Add", [rows_own, row_bias])], axis=-1
        )
        sb = b.one("Softmax", [scores], axis=-1)
        yb = b.one(
            "Add",
            [
                b.one("MatMul", [lay.prompt(sb, lay.last_axis), vp]),
                b.one("MatMul", [lay.rows(sb, lay.last_axis), vb]),
            ],
        )
        y = lay.tokens(b.one("MatMul", [sp, vp]), yb)
        a = b.one("Add", [h, b.one("Gemm", [y, w + "attn.c_proj.weight", w + "attn.c_proj.bias"])])
        x2, mu2, rs2 = b.op(
            "LayerNormalization", [a, w + "ln_2.weight", w + "ln_2.bias"], 3, epsilon=shape.eps
        )
        u = b.one("Gemm", [x2, w + "mlp.c_fc.weight", w + "mlp.c_fc.bias"])
        m = activation(b, shape.activation, u)
        names = dict(h=h, mu1=mu1, rs1=rs1, x1=x1, qp=qp, kp=kp, vp=vp, qb=qb, kb=kb, vb=vb)
        names.update(sp=sp, sb=sb, y=y, a=a, mu2=mu2, rs2=rs2, x2=x2, u=u, m=m)
        saved.update({f"{key}{layer}": value for key, value in names.items()})
        h = b.one("Add", [a, b.one("Gemm", [m, w + "mlp.c_proj.weight", w + "mlp.c_proj.bias"])])
    last = b.one("Sub", [lay.p, b.value(np.array([1], np.int64))])
    hf = b.one("Slice", [h, last, lay.big, lay.first_axis])
    z, muf, rsf = b.op(
        "LayerNormalization",
        [hf, "transformer.ln_f.weight", "transformer.ln_f.bias"],
        3,
        epsilon=shape.eps,
    )
    logits = b.one("Gemm", [z, _head(shape)], transB=1)
    logp = b.one("LogSoftmax", [b.one("Div", [logits, "temperature"])], axis=-1)
    saved.update(hf=hf, muf=muf, rsf=rsf, z=z, logp=logp)
    b.output(b.one("GatherND", [logp, "pick"]), "log_probs", f32, [2, "B", "T1"])
    for name in saved_names(shape):
        b.output(saved[name], name, f32, _saved_dims(name))
    return b.model("score_forward")


def _layer_norm_backward(
    b: GraphBuilder, lay: _Layout, grad: str, x: str, mu: str, rs: str, gamma: str
) -> tuple[str, str, str]:
    """The gradients of y = (x - mu) rs gamma + beta: (dx, d gamma, d beta)."""
    xh = b.one("Mul", [b.one("Sub", [x, mu]), rs])
    d_gamma = b.one("ReduceSum", [b.one("Mul", [grad, xh]), lay.first_axis], keepdims=0)
    d_beta = b.one("ReduceSum", [grad, lay.first_axis], keepdims=0)
    dxh = b.one("Mul", [grad, gamma])
    mean = b.one("ReduceMean", [dxh, lay.last_axis], keepdims=1)
    mean_xh = b.one("ReduceMean", [b.one("Mul", [dxh, xh]), lay.last_axis], keepdims=1)
    centred = b.one("Sub", [b.one("Sub", [dxh, mean]), b.one("Mul", [xh, mean_xh])])
    return b.one("Mul", [rs, centred]), d_gamma, d_beta


def _softmax_backward(b: GraphBuilder, lay: _Layout, probs: str, grad: str) -> str:
    """The gradient of softmax's input: s (g - sum(g s))."""
    inner = b.one("ReduceSum", [b.one("Mul", [grad, probs]), lay.last_axis], keepdims=1)
    return b.one("Mul", [probs, b.one("Sub", [grad, inner])])


def _activation_slope(b: GraphBuilder, kind: str, u: str) -> str:
    """act'(u), elementwise."""
    from onnx import TensorProto

    def k(value: float) -> str:
        return b.value(np.array(value, np.float32))

    if (
        kind == "gelu_tanh"
    ):  # 0.5 (1 + t) + (1 - t^2) u c (0.5 + 1.5 a u^2), t = tanh(c (u + a u^3))
        c, a = math.sqrt(2.0 / math.pi), 0.044715
        u2 = b.one("Mul", [u, u])
        t = b.one("Tanh", [b.one("Mul", [u, b.one("Add", [b.one("Mul", [u2, k(a * c)]), k(c)])])])
        slope = b.one("Mul", [u, b.one("Add", [b.one("Mul", [u2, k(1.5 * a * c)]), k(0.5 * c)])])
        flat = b.one("Sub", [k(1.0), b.one("Mul", [t, t])])
        return b.one(
            "Add", [b.one("Mul", [b.one("Add", [t, k(1.0)]), k(0.5)]), b.one("Mul", [flat, slope])]
        )
    if kind == "gelu":  # Phi(u) + u phi(u)
        cdf = b.one(
            "Mul", [b.one("Add", [b.one("Erf", [b.one("Mul", [u, k(0.5**0.5)])]), k(1.0)]), k(0.5)]
        )
        density = b.one(
            "Mul",
            [
                b.one("Exp", [b.one("Mul", [b.one("Mul", [u, u]), k(-0.5)])]),
                k((2 * math.pi) ** -0.5),
            ],
        )
        return b.one("Add", [cdf, b.one("Mul", [u, density])])
    if kind == "relu":  # torch's: 0 at u = 0
        return b.one("Cast", [b.one("Greater", [u, k(0.0)])], to=TensorProto.FLOAT)
    if kind == "silu":  # s (1 + u (1 - s))
        s = b.one("Sigmoid", [u])
        return b.one(
            "Mul", [s, b.one("Add", [k(1.0), b.one("Mul", [u, b.one("Sub", [k(1.0), s])])])]
        )
    raise ValueError(f"activation: no gradient for {kind!r}")


def backward_graph(shape: ScoreShape) -> bytes:
    """The serialised ``backward`` graph (module docstring)."""
    from onnx import TensorProto

    f32 = TensorProto.FLOAT
    b = GraphBuilder()
    _weights(b, shape)
    _common_inputs(b)
    grad = b.input("grad", f32, [2, "B", "T1"])
    for name in saved_names(shape):
        b.input(name, f32, _saved_dims(name))
    lay = _Layout(
        b,
        shape,
        b.one("Shape", ["kp0"], start=1, end=2),
        b.one("Shape", ["qb0"], start=2, end=3),
    )
    scale = b.value(np.array((shape.n_embd // shape.n_head) ** -0.5, np.float32))

    def t(x: str, *perm: int) -> str:
        return b.one("Transpose", [x], perm=list(perm))

    def matmul(x: str, y: str) -> str:
        return b.one("MatMul", [x, y])

    def column_sum(x: str) -> str:
        return b.one("ReduceSum", [x, lay.first_axis], keepdims=0)

    def weight_grad(x: str, g: str) -> str:
        return b.one("Gemm", [x, g], transA=1)

    def input_grad(g: str, weight: str) -> str:
        return b.one("Gemm", [g, weight], transB=1)

    grads: dict[str, str] = {}
    # log_probs = logp[pick]: scatter the gradient back, then through the log-softmax
    zeros = b.one("ConstantOfShape", [b.one("Shape", ["logp"])])
    spread = b.one("ScatterND", [zeros, "pick", grad], reduction="add")
    total = b.one("ReduceSum", [spread, lay.last_axis], keepdims=1)
    d_logits = b.one(
        "Div",
        [b.one("Sub", [spread, b.one("Mul", [total, b.one("Exp", ["logp"])])]), "temperature"],
    )
    head = _head(shape)
    d_head = weight_grad(d_logits, "z")
    d_hf, grads["transformer.ln_f.weight"], grads["transformer.ln_f.bias"] = _layer_norm_backward(
        b, lay, matmul(d_logits, head), "hf", "muf", "rsf", "transformer.ln_f.weight"
    )
    zero = b.value(np.array([0], np.int64))
    before = b.one("Sub", [lay.p, b.value(np.array([1], np.int64))])
    dh = b.one("Pad", [d_hf, b.one("Concat", [before, zero, zero, zero], axis=0)])
    for layer in reversed(range(shape.n_layer)):
        w = f"transformer.h.{layer}."

        def s(name: str) -> str:
            return f"{name}{layer}"  # noqa: B023

        def norm_backward(grad: str, x: str, k: int) -> str:
            """Through ln_k (of the saved ``x``), its weight's and bias's gradients kept."""
            norm = w + f"ln_{k}."  # noqa: B023
            dx, grads[norm + "weight"], grads[norm + "bias"] = _layer_norm_backward(
                b, lay, grad, s(x), s(f"mu{k}"), s(f"rs{k}"), norm + "weight"
            )
            return dx

        grads[w + "mlp.c_proj.weight"] = weight_grad(s("m"), dh)
        grads[w + "mlp.c_proj.bias"] = column_sum(dh)
        du = b.one(
            "Mul",
            [
                input_grad(dh, w + "mlp.c_proj.weight"),
                _activation_slope(b, shape.activation, s("u")),
            ],
        )
        grads[w + "mlp.c_fc.weight"] = weight_grad(s("x2"), du)
        grads[w + "mlp.c_fc.bias"] = column_sum(du)
        da = norm_backward(input_grad(du, w + "mlp.c_fc.weight"), "a", 2)
        da = b.one("Add", [dh, da])
        grads[w + "attn.c_proj.weight"] = weight_grad(s("y"), da)
        grads[w + "attn.c_proj.bias"] = column_sum(da)
        dy = input_grad(da, w + "attn.c_proj.weight")
        dyp, dyb = lay.prompt_heads(lay.prompt(dy)), lay.row_heads(lay.rows(dy))
        qp, kp, vp, qb, kb, vb, sp, sb = (
            s(n) for n in ("qp", "kp", "vp", "qb", "kb", "vb", "sp", "sb")
        )
        # the prompt's own attention
        vp_t = t(vp, 0, 2, 1)
        dvp = matmul(t(sp, 0, 2, 1), dyp)
        dcp = _softmax_backward(b, lay, sp, matmul(dyp, vp_t))
        dqp = matmul(dcp, kp)
        dkp = matmul(t(dcp, 0, 2, 1), qp)
        # the rows' attention over the prompt's keys and their own
        d_scores = b.one("Concat", [matmul(dyb, vp_t), matmul(dyb, t(vb, 0, 1, 3, 2))], axis=-1)
        dcb = _softmax_backward(b, lay, sb, d_scores)
        dcb_p, dcb_b = lay.prompt(dcb, lay.last_axis), lay.rows(dcb, lay.last_axis)
        dqb = b.one("Add", [matmul(dcb_p, kp), matmul(dcb_b, kb)])
        dkb = matmul(t(dcb_b, 0, 1, 3, 2), qb)
        dvb = matmul(t(lay.rows(sb, lay.last_axis), 0, 1, 3, 2), dyb)
        dkp = b.one("Add", [dkp, column_sum(matmul(t(dcb_p, 0, 1, 3, 2), qb))])
        dvp = b.one(
            "Add", [dvp, column_sum(matmul(t(lay.prompt(sb, lay.last_axis), 0, 1, 3, 2), dyb))]
        )
        dq = b.one("Mul", [lay.tokens(dqp, dqb), scale])  # q was scaled before its products
        dqkv = b.one("Concat", [dq, lay.tokens(dkp, dkb), lay.tokens(dvp, dvb)], axis=1)
        grads[w + "attn.c_attn.weight"] = weight_grad(s("x1"), dqkv)
        grads[w + "attn.c_attn.bias"] = column_sum(dqkv)
        dh_ln = norm_backward(input_grad(dqkv, w + "attn.c_attn.weight"), "h", 1)
        dh = b.one("Add", [da, dh_ln])
    last = b.value(np.array([-1], np.int64))
    for name, index in (("transformer.wte.weight", "ids"), ("transformer.wpe.weight", "positions")):
        table = b.one("ConstantOfShape", [b.one("Shape", [name])])
        grads[name] = b.one(
            "ScatterND", [table, b.one("Unsqueeze", [index, last]), dh], reduction="add"
        )
    if shape.tied:
        grads["transformer.wte.weight"] = b.one("Add", [grads["transformer.wte.weight"], d_head])
    else:
        grads["lm_head.weight"] = d_head
    dims = weight_shapes(shape)
    for name in score_weight_names(shape):
        b.output(grads[name], "grad." + name, f32, dims[name])
    return b.model("score_backward")


def score_shape(model: torch.nn.Module) -> ScoreShape:
    """The graphs' shape for ``model``."""
    config = model.config
    wte = model.transformer.wte.weight
    return ScoreShape(
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        n_inner=config.n_inner or 4 * config.n_embd,
        vocab=wte.shape[0],
        positions=model.transformer.wpe.weight.shape[0],
        eps=float(config.layer_norm_epsilon),
        activation=ACTIVATIONS[config.activation_function],
        tied=model.lm_head.weight is wte,
    )


@functools.lru_cache(maxsize=8)
def sessions(shape: ScoreShape, threads: int, profile: str | None = None) -> tuple:
    """The ``forward`` and ``backward`` graphs' sessions, built once per shape, thread count and
    ``profile`` (a folder for ONNX Runtime's profiles, or None)."""
    return (
        session(forward_graph(shape), threads, profile),
        session(backward_graph(shape), threads, profile),
    )


@functools.lru_cache(maxsize=16)
def _masks(prompt_len: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The additive causal masks [P, P] and [T, T]."""

    def causal(n: int) -> np.ndarray:
        return np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)

    return causal(prompt_len), causal(width)


def host_inputs(
    prompt_ids: list[int],
    body: np.ndarray,
    next_tokens: np.ndarray,
    stop_id: int,
    temperature: float,
) -> dict[str, np.ndarray]:
    """The graphs' inputs but the weights: ``body`` [B, T] the rows' tokens, ``next_tokens``
    [B, T + 1] the token each log-probability is read at (``body``, then the stop)."""
    batch, width = body.shape
    prompt_len = len(prompt_ids)
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    ids = np.concatenate([prompt, body.reshape(-1).astype(np.int64)])
    steps = np.arange(prompt_len, prompt_len + width, dtype=np.int64)
    positions = np.concatenate([np.arange(prompt_len, dtype=np.int64), np.tile(steps, batch)])
    # the read-out row of column t of row b: the prompt's last token (0) for t = 0, else the
    # row's token t - 1 (1 + b T + t - 1)
    rows = np.zeros((batch, width + 1), dtype=np.int64)
    rows[:, 1:] = 1 + np.arange(batch, dtype=np.int64)[:, None] * width + np.arange(width)
    pick = np.empty((2, batch, width + 1, 2), dtype=np.int64)
    pick[:, :, :, 0] = rows
    pick[0, :, :, 1] = next_tokens
    pick[1, :, :, 1] = stop_id
    prompt_bias, row_bias = _masks(prompt_len, width)
    return {
        "ids": ids,
        "positions": positions,
        "pick": pick,
        "temperature": np.array(temperature, dtype=np.float32),
        "prompt_bias": prompt_bias,
        "row_bias": row_bias,
    }


class _Score(torch.autograd.Function):
    """log_probs [2, B, T + 1] of the weights (the ``forward`` graph), with the ``backward``
    graph as its gradient."""

    @staticmethod
    def forward(
        ctx, shape: ScoreShape, feeds: dict, profile: str | None, *weights: torch.Tensor
    ) -> torch.Tensor:
        forward_session, backward_session = sessions(shape, torch.get_num_threads(), profile)
        names = score_weight_names(shape)
        bound = {name: w.detach().numpy() for name, w in zip(names, weights, strict=True)}
        keep = saved_names(shape)
        out = forward_session.run(["log_probs", *keep], {**bound, **feeds})
        if any(ctx.needs_input_grad):
            ctx.feeds = {
                **bound,
                **{key: feeds[key] for key in ("ids", "positions", "pick", "temperature")},
                **dict(zip(keep, out[1:], strict=True)),
            }
            ctx.session, ctx.names = backward_session, names
        return torch.from_numpy(out[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        feeds = {**ctx.feeds, "grad": grad.detach().contiguous().float().numpy()}
        grads = ctx.session.run(["grad." + name for name in ctx.names], feeds)
        del ctx.feeds
        return (None, None, None, *(torch.from_numpy(g) for g in grads))


def log_probs(
    model: torch.nn.Module,
    prompt_ids: list[int],
    body: torch.Tensor,
    next_tokens: torch.Tensor,
    stop_id: int,
    temperature: float = 1.0,
    profile: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_lp, stop_lp)`` [B, T + 1] of rows sharing the prompt ``prompt_ids``, followed by
    the tokens ``body`` [B, T] (T >= 1): ``token_log_probs(shared_prompt_logits(model,
    prompt_ids, body), next_tokens, stop_id, temperature)``, with gradients to the parameters
    (``profile``: a folder for ONNX Runtime's profiles)."""
    shape = score_shape(model)
    params = dict(model.named_parameters())
    params["lm_head.weight"] = model.lm_head.weight
    weights = [params[name] for name in score_weight_names(shape)]
    feeds = host_inputs(
        prompt_ids, body.cpu().numpy(), next_tokens.cpu().numpy(), stop_id, temperature
    )
    both = _Score.apply(shape, feeds, profile, *weights)
    return both[0], both[1]


def model_and_rows(
    rows: int, width: int, seed: int = 3
) -> tuple[Any, list[int], torch.Tensor, int]:
    """The embedded model with every parameter moved off its initialisation (biases and layer
    norms are 0 and 1 there), the main job's prompt ids, ``rows`` x ``width`` random tokens, and
    the stop id."""
    from raptb.adapters.lm.models import load_model_and_tokenizer
    from raptb.adapters.lm.tokens import stop_token_id

    model, tokenizer = load_model_and_tokenizer("tiny", seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    prompt = tokenizer("Expr24:")["input_ids"]
    vocab = model.transformer.wte.weight.shape[0]
    body = torch.randint(0, vocab, (rows, width), generator=generator)
    return model, list(prompt), body, stop_token_id(tokenizer)


def torch_log_probs(
    model: Any, prompt: list[int], body: torch.Tensor, stop: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the trainer's own rescoring (lean forward, then token_log_probs)."""
    from raptb.adapters.lm.embedded import lean_gpt2
    from raptb.adapters.lm.rollout_record import token_log_probs

    following = torch.cat([body, torch.full_like(body[:, :1], stop)], dim=1)
    logits = lean_gpt2.shared_prompt_logits(model, prompt, body)
    return token_log_probs(logits, following, stop, temperature)


def onnx_log_probs(
    model: Any,
    prompt: list[int],
    body: torch.Tensor,
    stop: int,
    temperature: float = 1.0,
    profile: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same through the two graphs."""
    following = torch.cat([body, torch.full_like(body[:, :1], stop)], dim=1)
    return log_probs(model, prompt, body, following, stop, temperature, profile)


def gradients(
    model: Any,
    path: Any,
    prompt: list[int],
    body: torch.Tensor,
    stop: int,
    weight: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probabilities [2, B, T + 1] of ``path`` and each parameter's gradient of
    sum(weight * log-probabilities)."""
    model.zero_grad(set_to_none=True)
    token_lp, stop_lp = path(model, prompt, body, stop, temperature)
    both = torch.stack([token_lp, stop_lp])
    (both * weight).sum().backward()
    return both.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def check(
    rows: int, width: int, seed: int = 3, temperature: float = 1.0, act: str | None = None
) -> dict[str, float]:
    """The largest difference of the log-probabilities, and of each parameter's gradient relative
    to its largest entry, between this path and torch's autograd (``act``: another of
    transformers' activation names for the model's MLP)."""
    from transformers.activations import ACT2FN

    model, prompt, body, stop = model_and_rows(rows, width, seed)
    if act is not None:
        model.config.activation_function = act
        for block in model.transformer.h:
            block.mlp.act = ACT2FN[act]
    weight = torch.randn((2, rows, width + 1), generator=torch.Generator().manual_seed(seed + 1))
    ref_lp, ref_grads = gradients(model, torch_log_probs, prompt, body, stop, weight, temperature)
    lp, grads = gradients(model, onnx_log_probs, prompt, body, stop, weight, temperature)
    found = {"log_probs": float((lp - ref_lp).abs().max())}
    for name, ref in ref_grads.items():
        found[name] = float((grads[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    return found


def timing(rows: int, width: int, rounds: int, reps: int) -> list[dict[str, float]]:
    """Per round and path, the median ms of the forward (with gradients kept), the backward, and
    both, over ``reps`` calls; the two paths alternate round by round."""
    model, prompt, body, stop = model_and_rows(rows, width)
    weight = torch.randn((2, rows, width + 1))
    found = []
    for index in range(2 * rounds):
        path, name = ((torch_log_probs, "torch"), (onnx_log_probs, "onnx"))[index % 2]
        forward, backward = [], []
        for _ in range(reps + 3):
            model.zero_grad(set_to_none=True)
            tic = time.perf_counter()
            token_lp, stop_lp = path(model, prompt, body, stop)
            loss = (torch.stack([token_lp, stop_lp]) * weight).sum()
            middle = time.perf_counter()
            loss.backward()
            forward.append(1000 * (middle - tic))
            backward.append(1000 * (time.perf_counter() - middle))
        forward, backward = forward[3:], backward[3:]
        both = [f + b for f, b in zip(forward, backward, strict=True)]
        found.append(
            {
                "round": index // 2,
                "path": name,
                "forward_ms": statistics.median(forward),
                "backward_ms": statistics.median(backward),
                "both_ms": statistics.median(both),
            }
        )
    return found


def ops(rows: int, width: int, reps: int) -> dict[str, dict[str, float]]:
    """ONNX Runtime's profile of ``reps`` forward and backward calls: microseconds a call by
    operator type, for each graph, and the kernels' total."""
    model, prompt, body, stop = model_and_rows(rows, width)
    weight = torch.randn((2, rows, width + 1))
    shape = score_shape(model)
    with tempfile.TemporaryDirectory() as folder:
        profiled = functools.partial(onnx_log_probs, profile=folder)
        for _ in range(reps):
            gradients(model, profiled, prompt, body, stop, weight)
        forward_session, backward_session = sessions(shape, torch.get_num_threads(), folder)
        found = {}
        for label, session in (("forward", forward_session), ("backward", backward_session)):
            events = json.loads(Path(session.end_profiling()).read_text())
            by_op: dict[str, float] = {}
            for event in events:
                if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                    op = event["args"]["op_name"]
                    by_op[op] = by_op.get(op, 0.0) + event["dur"] / reps
            ranked = dict(sorted(by_op.items(), key=lambda item: -item[1]))
            found[label] = {"kernels_total_us": sum(by_op.values()), **ranked}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["check", "time", "ops"])
    parser.add_argument("--rows", type=int, default=97, help="distinct rows (the main job's mean)")
    parser.add_argument("--width", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "check":
        print(json.dumps(check(args.rows, args.width), indent=1))
    elif args.mode == "ops":
        print(json.dumps(ops(args.rows, args.width, args.reps), indent=1))
    else:
        print("| round | path | forward ms | backward ms | forward + backward ms |")
        print("|---:|---|---:|---:|---:|")
        for r in timing(args.rows, args.width, args.rounds, args.reps):
            print(
                f"| {r['round']} | {r['path']} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} "
                f"| {r['both_ms']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
