"""The rollout's column as an ONNX graph: GPT-2's one-token forward and the behaviour's draw.

For the embedded model (2 blocks, width 64) a rollout column is about 60 torch operations of the
forward and 20 of the sampling, each 2-20 us of dispatch on a CPU core for microseconds of
arithmetic; ONNX Runtime runs the same graph from C++ in one call. Two graphs, built from the
model's configuration only (its weights are inputs, bound to the parameters' memory at each
rollout, so the graph follows the optimizer's in-place updates):

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
prompt's pads; the new column's 0) (``raptb.adapters.lm.lean_gpt2.forward``'s function with its
``key_mask``, the same operations in ONNX's names), then ``sample`` on its logits; it also
returns the keys and values with the new column.

``stop_lp`` and ``token_lp`` are computed as ``rollout_record.token_log_probs`` computes them (a
gathered logit minus the log-normaliser), ``log_norm`` is returned so that the caller can refuse
a non-finite distribution as torch.multinomial does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

OPSET = 20
"""ONNX's opset: ``Gelu`` with the tanh approximation (GPT-2's) is in 20."""

ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
"""transformers' ``activation_function`` names (``ACT2FN``) the graph computes, by the function
each is: the tanh approximation (GPT-2's), the exact (erf) GELU, ReLU, x sigmoid(x). A model with
another activation decodes on the eager path."""


@dataclass(frozen=True)
class ModelShape:
    """What a GPT-2 graph depends on: the model's configuration."""

    n_layer: int
    n_head: int
    n_embd: int
    n_inner: int
    vocab: int
    positions: int
    eps: float
    activation: str = "gelu_tanh"
    """The MLP's activation, one of ``ACTIVATIONS``' values."""


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


def weight_names(shape: ModelShape) -> list[str]:
    """The graph's weight inputs, named as ``GPT2LMHeadModel.named_parameters`` names them."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for layer in range(shape.n_layer):
        block = f"transformer.h.{layer}."
        names += [
            block + part
            for part in (
                "ln_1.weight",
                "ln_1.bias",
                "attn.c_attn.weight",
                "attn.c_attn.bias",
                "attn.c_proj.weight",
                "attn.c_proj.bias",
                "ln_2.weight",
                "ln_2.bias",
                "mlp.c_fc.weight",
                "mlp.c_fc.bias",
                "mlp.c_proj.weight",
                "mlp.c_proj.bias",
            )
        ]
    return [*names, "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]


def weight_shapes(shape: ModelShape) -> dict[str, list[int]]:
    c, inner = shape.n_embd, shape.n_inner
    per_block = {
        "ln_1.weight": [c],
        "ln_1.bias": [c],
        "attn.c_attn.weight": [c, 3 * c],
        "attn.c_attn.bias": [3 * c],
        "attn.c_proj.weight": [c, c],
        "attn.c_proj.bias": [c],
        "ln_2.weight": [c],
        "ln_2.bias": [c],
        "mlp.c_fc.weight": [c, inner],
        "mlp.c_fc.bias": [inner],
        "mlp.c_proj.weight": [inner, c],
        "mlp.c_proj.bias": [c],
    }
    shapes = {
        "transformer.wte.weight": [shape.vocab, c],
        "transformer.wpe.weight": [shape.positions, c],
        "transformer.ln_f.weight": [c],
        "transformer.ln_f.bias": [c],
        "lm_head.weight": [shape.vocab, c],
    }
    for layer in range(shape.n_layer):
        for part, dims in per_block.items():
            shapes[f"transformer.h.{layer}.{part}"] = dims
    return shapes


@dataclass
class GraphBuilder:
    """Nodes, constants, inputs and outputs of one graph, with unique intermediate names."""

    nodes: list = field(default_factory=list)
    constants: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    count: int = 0

    def op(self, kind: str, inputs: Sequence[str], outputs: int = 1, **attributes) -> list[str]:
        from onnx import helper

        self.count += 1
        names = [f"{kind.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, **attributes))
        return names

    def one(self, kind: str, inputs: Sequence[str], **attributes) -> str:
        return self.op(kind, inputs, **attributes)[0]

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.constants.append(numpy_helper.from_array(value, name))
        return name

    def value(self, value: np.ndarray) -> str:
        """A constant under a fresh name."""
        self.count += 1
        return self.constant(f"const_{self.count}", np.asarray(value))

    def input(self, name: str, dtype: int, dims: Sequence[int | str]) -> str:
        from onnx import helper

        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(dims)))
        return name

    def output(self, source: str, name: str, dtype: int, dims: Sequence[int | str]) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node("Identity", [source], [name]))
        self.outputs.append(helper.make_tensor_value_info(name, dtype, list(dims)))

    def model(self, name: str) -> bytes:
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 9  # opset 20's: what ONNX Runtime 1.17 onwards reads
        onnx.checker.check_model(model)
        return model.SerializeToString()


def _forward(b: GraphBuilder, shape: ColumnShape) -> str:
    """GPT-2's one-token forward: the logits [n, V]; declares its inputs and the new keys and
    values as outputs ``present_k{l}``, ``present_v{l}``."""
    from onnx import TensorProto

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    c, heads = shape.n_embd, shape.n_head
    head = c // heads
    tokens = b.input("tokens", i64, ["n"])
    positions = b.input("positions", i64, ["n"])
    for name, dims in weight_shapes(shape).items():
        b.input(name, f32, dims)
    key_bias = b.input("key_bias", f32, ["n", "s1"])
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
    for layer in range(shape.n_layer):
        p = f"transformer.h.{layer}."
        x = b.one("LayerNormalization", [h, p + "ln_1.weight", p + "ln_1.bias"], epsilon=shape.eps)
        qkv = b.one("Gemm", [x, p + "attn.c_attn.weight", p + "attn.c_attn.bias"])
        q, k, v = (b.one("Reshape", [t, as_heads]) for t in b.op("Split", [qkv, thirds], 3, axis=1))
        past_k = b.input(f"past_k{layer}", f32, ["n", heads, "s", head])
        past_v = b.input(f"past_v{layer}", f32, ["n", heads, "s", head])
        keys = b.one("Concat", [past_k, k], axis=2)
        values = b.one("Concat", [past_v, v], axis=2)
        b.output(keys, f"present_k{layer}", f32, ["n", heads, "s1", head])
        b.output(values, f"present_v{layer}", f32, ["n", heads, "s1", head])
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
    return b.one("Gemm", [x, "lm_head.weight"], transB=1)


def activation(b: GraphBuilder, kind: str, x: str) -> str:
    if kind == "gelu_tanh":
        return b.one("Gelu", [x], approximate="tanh")
    if kind == "gelu":
        return b.one("Gelu", [x])
    if kind == "relu":
        return b.one("Relu", [x])
    if kind == "silu":
        return b.one("Mul", [x, b.one("Sigmoid", [x])])
    raise ValueError(
        f"activation: expected one of {sorted(set(ACTIVATIONS.values()))}, got {kind!r}"
    )


def _sample(b: GraphBuilder, shape: ColumnShape, logits: str) -> None:
    """The behaviour's draw and the log-probabilities (module docstring) on ``logits`` [n, V]."""
    from onnx import TensorProto

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    k = shape.width
    mask = b.input("mask", TensorProto.BOOL, ["n", k])
    temperature = b.input("temperature", f32, ["n", 1])
    noise = b.input("noise", f32, ["n", k])
    sub_ids = b.constant("sub_ids", np.array(shape.sub_ids, np.int64))
    stop = b.constant("stop", np.array([shape.stop_id], np.int64))
    minus_inf = b.constant("minus_inf", np.array(-np.inf, np.float32))
    sub = b.one("Gather", [logits, sub_ids], axis=1)
    behaviour = b.one("Where", [mask, b.one("Div", [sub, temperature]), minus_inf])
    chances = b.one("Div", [b.one("Softmax", [behaviour], axis=1), noise])
    choice = b.one("ArgMax", [chances], axis=1, keepdims=1)  # [n, 1], the first of ties
    log_norm = b.one("ReduceLogSumExp", [logits, b.constant("last", np.array([1], np.int64))])
    token = b.one("Sub", [b.one("GatherElements", [sub, choice], axis=1), log_norm])
    stop_lp = b.one("Sub", [b.one("Gather", [logits, stop], axis=1), log_norm])
    flat = b.constant("flat", np.array([-1], np.int64))
    b.output(b.one("Reshape", [choice, flat]), "choice", i64, ["n"])
    b.output(b.one("Reshape", [token, flat]), "token_lp", f32, ["n"])
    b.output(b.one("Reshape", [stop_lp, flat]), "stop_lp", f32, ["n"])
    b.output(b.one("Reshape", [log_norm, flat]), "log_norm", f32, ["n"])


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
