"""LoRA's dropout with a fast mask on a CPU.

peft applies ``nn.Dropout(p)`` to the input of every LoRA layer (SmolLM2: 210 of them, each on a
[rows x tokens, 576 or 1536] input). On a CPU torch draws that mask with ``bernoulli_`` at about
20 ns an entry; NumPy's PCG64 draws the same distribution's uniforms at about 1 ns an entry. On
SmolLM2 + LoRA r16, 32 rows, one thread, this made the rescoring forward 1.19x (SMILES) and 1.10x
(Expr24) faster, 0.2-0.4 s a step (benchmarks/pretrained_step.md, "LoRA's dropout").

:class:`FastDropout` is ``nn.Dropout``'s function (each entry kept with probability 1 - p and
scaled by 1 / (1 - p), in training mode only) with its mask from NumPy's ``Generator`` on a CPU
tensor; on any other device it is ``nn.Dropout`` (torch's own kernel). Each call seeds a fresh
``Generator`` with one int64 drawn from torch's global generator, so a run's masks follow
``torch.manual_seed`` and a checkpoint's saved torch state as nn.Dropout's do: the same seed, the
same masks (not nn.Dropout's masks: a different draw of the same distribution).
"""

from __future__ import annotations

import numpy as np
import torch

_SEED_HIGH = 2**62


class FastDropout(torch.nn.Dropout):
    """``nn.Dropout`` whose mask on a CPU tensor comes from NumPy (the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        if self.p == 1.0:
            return x * 0.0
        seed = int(torch.randint(0, _SEED_HIGH, (), dtype=torch.int64))
        uniform = np.random.default_rng(seed).random(tuple(x.shape), dtype=np.float32)
        mask = np.multiply(uniform >= self.p, 1.0 / (1.0 - self.p), dtype=np.float32)
        return x * torch.from_numpy(mask).to(x.dtype)


def use_fast_dropout(model: torch.nn.Module) -> int:
    """Replace every ``nn.Dropout`` in ``model``'s LoRA layers (peft's ``lora_dropout``) by a
    :class:`FastDropout` of the same p; returns how many were replaced."""
    replaced = 0
    for module in model.modules():
        layers = getattr(module, "lora_dropout", None)
        if not isinstance(layers, torch.nn.ModuleDict):
            continue
        for name, layer in list(layers.items()):
            if type(layer) is torch.nn.Dropout:
                layers[name] = FastDropout(layer.p)
                replaced += 1
    return replaced
