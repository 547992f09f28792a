"""``lanes`` through a run: None resolves to 1 on the embedded model (adapters.lm.lanes'
``lane_count``) and config.toml records what ran; two lanes run a GFlowNet step's two
micro-batches side by side and train the same weights as one lane, within float32 reordering."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from raptb.adapters.lm.lanes import Lanes
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer


def _run(tmp_path: Path, lanes: int | None) -> tuple[int, list[torch.Tensor]]:
    overrides: dict[str, object] = {
        "steps": 1,
        "optim.batch_size": 4,
        "optim.grad_accum": 2,
        "threads": 1,
    }
    if lanes is not None:
        overrides["lanes"] = lanes
    run = tmp_path / f"run{lanes}"
    trainer = Trainer(build_config(overrides=overrides), run, progress=False)
    trainer.train()
    recorded = tomllib.loads((run / "config.toml").read_text())["lanes"]
    params = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    return recorded, [*params, trainer.algorithm.log_z.detach().clone()]


def test_lanes_record_and_train_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded, one = _run(tmp_path, None)
    assert recorded == 1
    sizes: list[int] = []
    run = Lanes.run
    monkeypatch.setattr(
        Lanes, "run", lambda self, work, **kw: sizes.append(len(work)) or run(self, work, **kw)
    )
    recorded, two = _run(tmp_path, 2)
    assert recorded == 2
    assert sizes == [2]  # the step's two micro-batches, one lane each
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
