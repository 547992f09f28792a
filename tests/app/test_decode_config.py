"""``sampling.decode``: validated with the configuration, handed to the trainer's policy, and runs
on the static and compiled paths train like one on the eager path (same rollouts, so the same
records up to the float rounding of the log-probs); the former name ``onnx`` and the retired
``optim.compiled_rollout``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.configuration.record import config_toml
from raptb.app.run_dir.run_config import load_config
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


def test_static_and_compiled_runs_train_like_eager(tmp_path: Path) -> None:
    records = {}
    for decode in ("eager", "static", "compiled"):
        config = build_config(overrides={**OVERRIDES, "sampling.decode": decode})
        trainer = Trainer(config, tmp_path / decode, progress=False)
        assert trainer.policy.decode_path == decode
        trainer.train()
        lines = (tmp_path / decode / "metrics.jsonl").read_text().splitlines()
        records[decode] = [json.loads(line) for line in lines]
    for other in ("static", "compiled"):
        assert len(records["eager"]) == len(records[other]) >= 2
        for eager, record in zip(records["eager"], records[other], strict=True):
            assert eager.keys() == record.keys()
            for key, value in eager.items():
                if key == "seconds":  # wall time
                    continue
                assert record[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (other, key)


def test_onnx_is_read_as_compiled_with_a_warning(tmp_path: Path) -> None:
    """``sampling.decode = "onnx"`` (the compiled path's former name), from the flags or a run's
    own config.toml: the compiled path, a FutureWarning naming it."""
    with pytest.warns(FutureWarning, match='now called "compiled"'):
        config = build_config(overrides={**OVERRIDES, "sampling.decode": "onnx"})
    assert config.sampling.decode == "compiled"
    recorded = tmp_path / "config.toml"
    text = config_toml(build_config(overrides=OVERRIDES))
    recorded.write_text(text.replace('decode = "auto"', 'decode = "onnx"'))
    with pytest.warns(FutureWarning, match='write decode = "compiled"'):
        assert load_config(recorded).sampling.decode == "compiled"


def test_the_retired_compiled_rollout_key(tmp_path: Path) -> None:
    """``optim.compiled_rollout`` (a switch of the rollout's engine, now always compiled): a run
    folder's config.toml that records it loads, the key dropped; a config file that sets it
    exits 2 with one line saying what to do."""
    text = config_toml(build_config(overrides=OVERRIDES))
    assert "[optim]\n" in text and "compiled_rollout" not in text
    old = text.replace("[optim]\n", "[optim]\ncompiled_rollout = true\n")
    recorded = tmp_path / "config.toml"
    recorded.write_text(old)
    assert load_config(recorded) == build_config(overrides=OVERRIDES)
    with pytest.raises(ConfigError, match=r"optim\.compiled_rollout: removed"):
        build_config(recorded)
    result = CliRunner().invoke(
        app, ["train", "--config", str(recorded), "--out", str(tmp_path / "run"), "--no-progress"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: invalid config: optim.compiled_rollout: removed; the path it chose always runs "
        "(on a CPU the embedded model's rollout is compiled "
        '(adapters/lm/embedded/compiled_rollout.py, sampling.decode = "compiled")); delete it '
        "from the file"
    ]
