"""``sampling.decode``: validated with the configuration, handed to the trainer's policy, and runs
on the static and ONNX paths train like one on the eager path (same rollouts, so the same records
up to the float rounding of the log-probs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.training.train import Trainer

OVERRIDES = {
    "task": "expr24",
    "steps": 2,
    "threads": 1,
    "optim.batch_size": 8,
    "optim.grad_accum": 1,
    "replay.kind": "none",  # every step on-policy: every step's batch is a rollout
}


def test_sampling_decode_is_validated() -> None:
    assert build_config(overrides=OVERRIDES).sampling.decode == "auto"
    with pytest.raises(ConfigError, match="decode"):
        build_config(overrides={**OVERRIDES, "sampling.decode": "graph"})


def test_static_and_onnx_runs_train_like_eager(tmp_path: Path) -> None:
    records = {}
    for decode in ("eager", "static", "onnx"):
        config = build_config(overrides={**OVERRIDES, "sampling.decode": decode})
        trainer = Trainer(config, tmp_path / decode, progress=False)
        assert trainer.policy.decode_path == decode
        trainer.train()
        lines = (tmp_path / decode / "metrics.jsonl").read_text().splitlines()
        records[decode] = [json.loads(line) for line in lines]
    for other in ("static", "onnx"):
        assert len(records["eager"]) == len(records[other]) >= 2
        for eager, record in zip(records["eager"], records[other], strict=True):
            assert eager.keys() == record.keys()
            for key, value in eager.items():
                if key == "seconds":  # wall time
                    continue
                assert record[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (other, key)
