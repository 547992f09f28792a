"""When a configuration makes the same run as one a run recorded (app.configuration.record's
``resolved_as`` beside ``recorded_data``): a planned ``model_dtype = "auto"`` matches the dtype
the run recorded ("auto" resolved on its device), an explicit dtype or any other field that
differs does not; ``--resume`` (app.run_dir.resume) and a study's run states (app.study.state)
both judge by it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.app.configuration.config import TrainConfig, build_config
from raptb.app.configuration.record import recorded_data, resolved_as
from raptb.app.run_dir.resume import RunMismatch, resumed_config, with_horizon
from raptb.app.run_dir.run_config import CONFIG_FILE, save_config
from raptb.app.study.state import config_difference

MODEL = "some/pretrained-model"  # a pretrained model: bfloat16 is a choice (never loaded here)
RESOLVED = ("float32", "bfloat16")


@functools.cache
def _config(loss: str, seed: int, dtype: str) -> TrainConfig:
    overrides = {"model": MODEL, "loss": loss, "seed": seed, "model_dtype": dtype, "steps": 10}
    return build_config(overrides=overrides)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["auto", *RESOLVED]),
    st.sampled_from(RESOLVED),
    st.sampled_from(["raptb", "tb"]),
    st.sampled_from(["raptb", "tb"]),
    st.integers(0, 1),
    st.integers(0, 1),
)
def test_auto_matches_the_recorded_dtype_and_nothing_else_differs_unseen(
    planned_dtype: str, ran: str, planned_loss: str, ran_loss: str, planned_seed: int, seed: int
) -> None:
    planned = _config(planned_loss, planned_seed, planned_dtype)
    recorded = _config(ran_loss, seed, ran)
    resolved = resolved_as(planned, recorded)
    same = planned_dtype in ("auto", ran) and (planned_loss, planned_seed) == (ran_loss, seed)
    assert (recorded_data(resolved) == recorded_data(recorded)) is same
    assert resolved.model_dtype == (ran if planned_dtype == "auto" else planned_dtype)
    assert resolved.model_copy(update={"model_dtype": planned_dtype}) == planned


def _run_dir(path: Path, recorded: TrainConfig) -> Path:
    """A run directory whose config.toml is ``recorded`` as a new run saves it."""
    path.mkdir(parents=True)
    save_config(with_horizon(recorded, recorded.schedule_horizon), path / CONFIG_FILE)
    return path


def test_resume_continues_in_the_dtype_auto_resolved_to_and_refuses_a_real_change(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path / "run", _config("raptb", 0, "bfloat16"))
    resumed = resumed_config(run, _config("raptb", 0, "auto"))
    assert resumed.model_dtype == "bfloat16"
    with pytest.raises(RunMismatch, match=r"in model_dtype \('bfloat16' -> 'float32'\);"):
        resumed_config(run, _config("raptb", 0, "float32"))
    with pytest.raises(RunMismatch, match=r"loss \('raptb' -> 'tb'\)"):
        resumed_config(run, _config("tb", 0, "auto"))


def test_a_study_sees_its_planned_auto_in_the_recorded_dtype_and_a_real_change(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path / "run", _config("raptb", 0, "bfloat16"))
    assert config_difference(_config("raptb", 0, "auto"), run) is None
    assert config_difference(_config("raptb", 0, "bfloat16"), run) is None
    assert config_difference(_config("raptb", 0, "float32"), run) == (
        "model_dtype = 'bfloat16', planned 'float32'"
    )
    assert config_difference(_config("tb", 0, "auto"), run) is not None
