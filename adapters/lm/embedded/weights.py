"""The embedded GPT-2 as the compiled code reads it: its shape (``GPT2Shape``), the activations
the kernels compute, and its weights packed for ``compiled_gpt2.forward`` (``packed``) straight
from a transformers ``GPT2LMHeadModel``.

The packed weights are NumPy views of the parameters where the layout allows (the embeddings,
the final layer norm) and copies where it does not (each block part stacked over the blocks, the
head transposed to [C, V] so that the logits are one product): they are packed again at each
rollout, so that a rollout reads the weights the optimizer left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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
"""transformers' ``activation_function`` names (``ACT2FN``) the kernels compute, by the function
each is: the tanh approximation (GPT-2's), the exact (erf) GELU, ReLU, x sigmoid(x). A model with
another activation decodes on the eager path."""

KINDS = {"gelu_tanh": 0, "gelu": 1, "relu": 2, "silu": 3}
"""``ACTIVATIONS``' values -> the kernels' activation code."""

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
"""A block's parameters, by their names under ``transformer.h.{layer}.``, in the kernels' order."""


@dataclass(frozen=True)
class GPT2Shape:
    """What the compiled rollout's arrays depend on: the model's configuration."""

    n_layer: int
    n_head: int
    n_embd: int
    n_inner: int
    vocab: int
    eps: float
    activation: str = "gelu_tanh"
    """The MLP's activation, one of ``ACTIVATIONS``' values."""


def shape_of(model: torch.nn.Module) -> GPT2Shape:
    """``model``'s shape (a ``GPT2LMHeadModel`` whose activation is in ``ACTIVATIONS``)."""
    config = model.config
    return GPT2Shape(
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        n_inner=config.n_inner or 4 * config.n_embd,
        vocab=model.lm_head.weight.shape[0],
        eps=float(config.layer_norm_epsilon),
        activation=ACTIVATIONS[config.activation_function],
    )


def packed(model: torch.nn.Module) -> tuple:
    """``compiled_gpt2.forward``'s model from ``model``'s parameters (float32, on the CPU): the
    token and position embeddings, each block part stacked over the blocks (``BLOCK_PARTS``'
    order), the final layer norm, the head transposed [C, V], the layer norms' epsilon and the
    activation's code (``KINDS``)."""
    shape = shape_of(model)
    transformer = model.transformer
    named = dict(model.named_parameters())

    def host(p: torch.Tensor) -> np.ndarray:
        return p.detach().numpy()

    blocks = tuple(
        np.stack([host(named[f"transformer.h.{layer}.{part}"]) for layer in range(shape.n_layer)])
        for part in BLOCK_PARTS
    )
    return (
        host(transformer.wte.weight),
        host(transformer.wpe.weight),
        blocks,
        host(transformer.ln_f.weight),
        host(transformer.ln_f.bias),
        np.ascontiguousarray(host(model.lm_head.weight).T),
        np.float32(shape.eps),
        KINDS[shape.activation],
    )
