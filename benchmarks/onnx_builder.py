"""GPT-2 in ONNX, the pieces the rescoring benchmark's graphs (``onnx_rescoring.py``) are built
with: the opset, the model's shape (``ModelShape``), its weights' names and shapes as
``GPT2LMHeadModel.named_parameters`` gives them, ``GraphBuilder``, which collects a graph's
nodes, constants, inputs and outputs under unique names, and ``session``, an ONNX Runtime session
of a graph. (The rollout's ONNX graphs, built with the same pieces, ran the embedded model's
rollout on the CPU until the compiled rollout replaced them: adapters/lm/embedded/onnx_graph.py at
b9cd778.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raptb.adapters.lm.embedded.weights import ACTIVATIONS, BLOCK_PARTS

OPSET = 20
"""ONNX's opset: ``Gelu`` with the tanh approximation (GPT-2's) is in 20."""


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
    """The MLP's activation, one of ``weights.ACTIVATIONS``' values."""


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


def session(graph: bytes, threads: int, profile: str | None = None):
    """An ONNX Runtime session of the serialised ``graph`` on the CPU: ``threads`` intra-op
    threads that sleep rather than spin when idle, errors only in the log; ``profile``: a folder
    for ONNX Runtime's profile of its calls."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile) / "onnx")
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
