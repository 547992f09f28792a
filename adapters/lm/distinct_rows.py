"""One forward per distinct row: the rows of a scoring batch that repeat another (the same
prompt and the same trajectory) are left out of the forward, and the outputs of the first copy
are given to every copy.

A replayed batch repeats itself: on the README's main job, 128 rows a step drawn from a buffer of
200 and the policy's own samples, 20-40% of the rows are copies of another row of the same step
(most early in training, while the buffer is small; benchmarks/step_speed.md). The copies' log-
probabilities are the same function of the parameters as the first's, so computing them once and
gathering them (``index_select``, whose backward adds the copies' gradients into the one row) gives
the same values and the same gradient, up to float rounding (the forward's batch is smaller);
every objective, loss and diagnostic still sees one value per row.

The rule holds only for a deterministic forward: a model in training mode with dropout draws
another mask for each copy, so ``stochastic_forward`` turns the merging off there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistinctRows:
    """The first row of each distinct value, in order of first appearance, and for every row
    the index of its value among them."""

    first: torch.Tensor
    """[n] long: the batch index of each distinct row's first copy, increasing."""
    inverse: torch.Tensor
    """[B] long: for each row, its distinct row's position in ``first``."""

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Per-distinct-row ``values`` [n, ...] back to one per row [B, ...] (with gradients)."""
        return values.index_select(0, self.inverse)


def distinct_rows(
    prompts: Sequence[Sequence[int]], body: torch.Tensor, length: torch.Tensor
) -> DistinctRows | None:
    """The distinct rows of a batch whose row i is prompt ids ``prompts[i]`` followed by
    ``body[i, :length[i]]`` (``body`` [B, T] with every id after a row's stop already set to one
    value, ``length`` [B]); None when every row is distinct (nothing to merge)."""
    b = body.shape[0]
    if b < 2:
        return None
    # on the host: a dict over B short tuples takes a tenth of torch.unique(dim=0)'s time here
    # (75 against 410 us for 128 rows of 9 ids on one core), and gives first appearances in order
    prompt_of: dict[tuple[int, ...], int] = {}
    keys = zip(
        [prompt_of.setdefault(tuple(row), len(prompt_of)) for row in prompts],
        length.tolist(),
        map(tuple, body.tolist()),
        strict=True,
    )
    position_of: dict[tuple[int, int, tuple[int, ...]], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for row, key in enumerate(keys):
        position = position_of.setdefault(key, len(first))
        if position == len(first):
            first.append(row)
        inverse.append(position)
    if len(first) == b:
        return None
    device = body.device
    return DistinctRows(
        first=torch.tensor(first, dtype=torch.long, device=device),
        inverse=torch.tensor(inverse, dtype=torch.long, device=device),
    )


ATTENTION_DROPOUT = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
"""Config fields of a dropout that transformers applies to attention functionally (no module)."""


def stochastic_forward(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward draws random numbers now: in training mode with a dropout
    module of p > 0 (a LoRA adapter's too) or an attention dropout > 0 in its config
    (``ATTENTION_DROPOUT``)."""
    if not model.training:
        return False
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, name, 0.0) or 0.0) > 0 for name in ATTENTION_DROPOUT)
