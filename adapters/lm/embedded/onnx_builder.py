"""GPT-2 in ONNX, the pieces every graph of it shares: the opset, the activations the graphs
compute, the model's shape (``ModelShape``), its weights' names and shapes as
``GPT2LMHeadModel.named_parameters`` gives them, and ``GraphBuilder``, which collects a graph's
nodes, constants, inputs and outputs under unique names. The rollout's graphs
(``onnx_graph``) and the rescoring benchmark's (``benchmarks/onnx_rescoring.py``) are built
with them.
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


BLOCK_PARTS = (
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
"""A block's parameters, by their names under ``transformer.h.{layer}.``, in the graph's order."""


def weight_names(shape: ModelShape) -> list[str]:
    """The graph's weight inputs, named as ``GPT2LMHeadModel.named_parameters`` names them."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for layer in range(shape.n_layer):
        names += [f"transformer.h.{layer}.{part}" for part in BLOCK_PARTS]
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
    prefix: str = ""
    """Before every intermediate's and constant's name: a loop body's names apart from its outer
    graph's, which it reads."""

    def op(self, kind: str, inputs: Sequence[str], outputs: int = 1, **attributes) -> list[str]:
        from onnx import helper

        self.count += 1
        names = [f"{self.prefix}{kind.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, **attributes))
        return names

    def one(self, kind: str, inputs: Sequence[str], **attributes) -> str:
        return self.op(kind, inputs, **attributes)[0]

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.prefix + name
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

    def graph(self, name: str):
        """The ``onnx.GraphProto`` (a loop's body, or a model's graph)."""
        from onnx import helper

        return helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.constants)

    def model(self, name: str) -> bytes:
        import onnx
        from onnx import helper

        graph = self.graph(name)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 9  # opset 20's: what ONNX Runtime 1.17 onwards reads
        onnx.checker.check_model(model)
        return model.SerializeToString()


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
