"""The top-level ``raptb`` package: version from the metadata, stable names re-exported lazily."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

import raptb


def test_version_comes_from_the_package_metadata():
    assert raptb.__version__ == version("raptb")


def test_stable_names_are_the_modules_own():
    from raptb import PrefixBatch, Trainer, objective_by_name, subm_select
    from raptb.adapters.tasks.registry import register_task, task_spec
    from raptb.app.training.train import Trainer as TrainerClass
    from raptb.core.gfn.batch import PrefixBatch as Batch
    from raptb.core.gfn.objectives import objective_by_name as by_name
    from raptb.core.subm.select import subm_select as select

    assert (PrefixBatch, objective_by_name, subm_select, Trainer) == (
        Batch,
        by_name,
        select,
        TrainerClass,
    )
    assert (raptb.task_spec, raptb.register_task) == (task_spec, register_task)
    for name in raptb.__all__:
        assert getattr(raptb, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        raptb.nope  # noqa: B018


def test_the_plug_in_api_is_exported():
    from raptb.app.configuration.losses import GRPO_ALGORITHM, ON_POLICY, Loss
    from raptb.app.training.algorithm import Algorithm
    from raptb.app.training.rl.grpo import GRPOAlgorithm
    from raptb.core.replay import BufferOption, ReplayBuffer, register_buffer
    from raptb.core.rl.base import RLObjective
    from raptb.core.rl.grpo import GRPO

    assert (raptb.Loss, raptb.Algorithm, raptb.RLObjective) == (Loss, Algorithm, RLObjective)
    assert (raptb.ReplayBuffer, raptb.register_buffer) == (ReplayBuffer, register_buffer)
    assert (raptb.BufferOption, raptb.GRPO, raptb.GRPOAlgorithm) == (
        BufferOption,
        GRPO,
        GRPOAlgorithm,
    )
    assert (raptb.ON_POLICY, raptb.GRPO_ALGORITHM) == (ON_POLICY, GRPO_ALGORITHM)
    module, _, name = raptb.GRPO_ALGORITHM.partition(":")
    assert getattr(importlib.import_module(module), name) is GRPOAlgorithm


def test_the_api_page_lists_every_exported_name():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    missing = [n for n in raptb.__all__ if not re.search(rf"`(raptb\.)?{n}\b", page)]
    assert not missing, f"docs/api.md does not list {missing}"


def test_core_names_load_no_framework():
    code = (
        "import sys\n"
        "from raptb import objective_by_name, PrefixBatch, subm_select, make_buffer\n"
        "print(sorted({'torch', 'transformers', 'rdkit', 'typer', 'pydantic'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("loss", ["grpo", "ppo", "raptb"])
def test_trainer_trains_any_loss_and_the_old_names_warn(tmp_path, loss):
    small = {"optim.batch_size": 8, "optim.grad_accum": 1, "threads": 1, "steps": 2}
    config = raptb.build_config(overrides={"loss": loss, **small})
    direct = raptb.Trainer(config, tmp_path / "direct", progress=False)
    assert direct.train().step == 2
    assert (tmp_path / "direct" / "metrics.jsonl").read_text().count("\n") == 2
    with pytest.warns(DeprecationWarning, match="Trainer.config, run_dir, .... trains every loss"):
        made = raptb.make_trainer(config, tmp_path / "made", progress=False)
    assert type(made) is raptb.Trainer and made.train().step == 2
    if loss != "raptb":  # the deprecated name still trains
        with pytest.warns(DeprecationWarning, match="Trainer trains every loss"):
            old = raptb.RLTrainer(config, tmp_path / "old", progress=False)
        assert isinstance(old, raptb.Trainer)
