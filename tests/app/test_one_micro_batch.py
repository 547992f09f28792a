"""The embedded model's GFlowNet step is one micro-batch of the step's rows unless the file or
the flags choose the split; pretrained models and the RL losses keep theirs."""

from __future__ import annotations

import pytest

from raptb.app.configuration.config import build_config


@pytest.mark.parametrize(
    ("overrides", "split"),
    [
        ({}, (128, 1)),  # Expr24: 32 x 4 rows in one micro-batch
        ({"task": "amp"}, (128, 1)),  # AMP's preset grad_accum 4 with the default 32
        ({"task": "commongen"}, (32, 1)),  # CommonGen's preset grad_accum 1
        ({"optim.batch_size": 16}, (16, 4)),  # the user's split is kept
        ({"optim.grad_accum": 2}, (32, 2)),
        ({"loss": "grpo"}, (32, 4)),  # the RL losses keep theirs
        ({"model": "smollm2-135m"}, (32, 4)),  # so do pretrained models
    ],
)
def test_the_embedded_models_step_is_one_micro_batch(overrides, split) -> None:
    optim = build_config(overrides=overrides).optim
    assert (optim.batch_size, optim.grad_accum) == split
