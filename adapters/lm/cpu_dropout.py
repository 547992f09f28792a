"""LoRA's dropout with a fast mask on a CPU.

peft applies ``nn.Dropout(p)`` to the input of every LoRA layer (SmolLM2: 210 of them, each on a
[rows x tokens, 576 or 1536] input). On a CPU torch draws that mask with ``bernoulli_`` at about
20 ns an entry. Here NumPy draws it: on SmolLM2 + LoRA r16, 32 rows, one thread, a float32
uniform an entry made the rescoring forward 1.19x (SMILES) and 1.10x (Expr24) faster, 0.2-0.4 s a
step (benchmarks/pretrained_step.md, "LoRA's dropout"); one random byte an entry (:func:`dropped`,
SFC64's raw words viewed as bytes) draws it faster again (benchmarks/dropout_mask.py; the same
file, "Freed memory kept").

:class:`FastDropout` is ``nn.Dropout``'s function (each entry dropped with probability p and the
others scaled by 1 / (1 - p), in training mode only; p resolved to a multiple of 2**-24, as a
float32 uniform's comparison resolves it) with its mask from NumPy's SFC64 bit generator on a
CPU tensor; on any other device it is ``nn.Dropout`` (torch's own kernel). Each call seeds a
fresh SFC64 with one int64 drawn from torch's global generator, so a run's masks follow
``torch.manual_seed`` and a checkpoint's saved torch state as nn.Dropout's do: the same seed, the
same masks (not nn.Dropout's masks: a different draw of the same distribution). In a thread that
draws from a generator of its own (:func:`drawing_from`: a lane, ``adapters.lm.lanes``), the int64
comes from that generator instead, so two lanes' masks do not depend on which draws first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

SEED_HIGH = 2**62
"""Seeds drawn from torch's generators for NumPy's (and a lane's, ``adapters.lm.lanes``) lie in
[0, SEED_HIGH)."""
_local = threading.local()


@contextmanager
def drawing_from(generator: torch.Generator) -> Iterator[None]:
    """In this thread, while the block runs, each mask's seed drawn from ``generator`` instead
    of torch's global generator."""
    before = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = before


BITS = 24
"""The resolution of p: a multiple of 2**-BITS (a float32 uniform's)."""


def byte_source(bits: np.random.BitGenerator) -> Callable[[int], np.ndarray]:
    """k -> [k] uint8 random bytes of ``bits``: its raw 64-bit words viewed as bytes (no copy,
    unlike ``Generator.bytes``)."""
    return lambda k: bits.random_raw((k + 7) // 8).view(np.uint8)[:k]


def dropped(draw: Callable[[int], np.ndarray], n: int, p: float) -> np.ndarray:
    """[n] bool: each entry True with probability round(p * 2**24) / 2**24, independently, from
    the random bytes ``draw(k)`` gives ([k] uint8).

    An entry is dropped when its 24-bit uniform integer u is below T = round(p * 2**24), compared
    a byte at a time from the top: u's first byte against T's decides all but the 1 in 256 entries
    that tie with it, whose next byte is drawn then (and the next after a second tie). The same
    event as u < T, at a byte drawn an entry instead of a float32 uniform's four."""
    threshold = round(p * 2**BITS)
    if threshold >= 2**BITS:
        return np.ones(n, dtype=bool)
    digits = threshold.to_bytes(BITS // 8, "big")
    first = draw(n)
    drop = first < digits[0]
    tied = np.flatnonzero(first == digits[0])
    for digit in digits[1:]:
        if tied.size == 0:
            break
        byte = draw(tied.size)
        drop[tied[byte < digit]] = True
        tied = tied[byte == digit]
    return drop


class FastDropout(torch.nn.Dropout):
    """``nn.Dropout`` whose mask on a CPU tensor comes from NumPy (the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        if self.p == 1.0:
            return x * 0.0
        generator = getattr(_local, "generator", None)
        seed = int(torch.randint(0, SEED_HIGH, (), dtype=torch.int64, generator=generator))
        drop = dropped(byte_source(np.random.SFC64(seed)), x.numel(), self.p)
        mask = np.multiply(~drop, 1.0 / (1.0 - self.p), dtype=np.float32).reshape(x.shape)
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
