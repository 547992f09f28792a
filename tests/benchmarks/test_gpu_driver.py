"""The GPU driver (benchmarks/gpu): the ``first`` plan's dry run on the CPU writes every field a
GPU slot must bring back, and a stage that fails or runs out of time is recorded while the next
one runs."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from raptb.adapters.lm.decode_mode import vllm_installed

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
RECORD_FIELDS = (
    "device", "date", "model", "rows", "max_length", "decode", "decode_ms_per_token_step",
    "tokens_per_s", "step_s", "peak_mib", "trainer",
)  # fmt: skip


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "out"
    args = ["--plan", "first", "--deadline", "1200", "--dry-run"]
    subprocess.run(
        [
            sys.executable,
            str(GPU / "driver.py"),
            *args,
            "--out",
            str(out),
            "--work",
            str(out.parent / "work"),
        ],
        cwd=ROOT,
        check=True,
        timeout=1200,
    )
    return out


def test_first_plan_dry_run_writes_every_field(dry_run, monkeypatch):
    monkeypatch.syspath_prepend(str(GPU))
    from stages_speed import VLLM_ABSENT

    files = sorted(p.name for p in dry_run.iterdir())
    assert files == [
        "headline_smollm2.json",
        "logs.tar.gz",
        "plan_first.json",
        "rollout_speed.json",
    ]
    plan = json.loads((dry_run / "plan_first.json").read_text())
    stages = plan["stages"]
    assert list(stages) == [
        "environment", "decode_1b", "decode_135m", "expr24_steps_135m", "decode_vllm",
        "headline_pair",
    ]  # fmt: skip
    assert {name: s["status"] for name, s in stages.items()} == dict.fromkeys(stages, "ok")
    env = stages["environment"]["result"]
    assert env["device"] == "cpu" and env["versions"]["torch"] and "nvidia_smi" in env

    records = json.loads((dry_run / "rollout_speed.json").read_text())
    for record in records:
        assert set(RECORD_FIELDS) <= set(record), set(RECORD_FIELDS) - set(record)
        assert record["graphs_captured"] is False  # no CUDA graph on a CPU
    decode = [r for r in records if r.get("task") == "fixed"]
    shapes = {r["plan_shape"] for r in decode}
    assert shapes == {"llama-1b", "smollm2-135m-shape"}
    assert {(r["decode"], r["identical_to_eager"]) for r in decode if r["decode"] == "static"} == {
        ("static", "1/1")
    }
    assert {r["decode"] for r in decode} == {"eager", "static"}
    vllm = stages["decode_vllm"]["result"]
    if vllm_installed():
        assert vllm["records"] > 0 and {r["decode"] for r in records} >= {"vllm"}
    else:  # the image has no vllm: the row says so, and nothing else is recorded
        assert vllm == {"skipped": VLLM_ABSENT}
        assert all(r["decode"] != "vllm" for r in records)
    steps = stages["expr24_steps_135m"]["result"]
    assert steps["steps_per_s"] > 0 and [r["task"] for r in records if "task" in r][-1] == "expr24"

    pair = json.loads((dry_run / "headline_smollm2.json").read_text())
    assert [(r["loss"], r["replay"]) for r in pair] == [("raptb", "subm"), ("tb", "rp")]
    for run in pair:
        assert run["exit_code"] == 0 and run["steps_done"] == 2 and run["steps_per_s"] > 0
        assert run["sampled"]["n_samples"] == 32 and run["last"]["step"] == 2
    with tarfile.open(dry_run / "logs.tar.gz") as archive:
        assert {f"logs/{name}.log" for name in stages} <= set(archive.getnames())


FAKE_STAGES = """
import time
def boom(ctx):
    raise RuntimeError("boom in the stage")
def slow(ctx):
    time.sleep(60)
def fine(ctx):
    return {"value": 1, "files": {"extra.json": [{"a": 1}]}}
fine_later = fine
"""


def test_a_failing_or_slow_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(GPU))
    import driver
    from plans import Stage

    (tmp_path / "stages_fake.py").write_text(FAKE_STAGES)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setitem(
        driver.PLANS,
        "fake",
        (
            Stage("boom", "stages_fake", 30, min_s=1),
            Stage("slow", "stages_fake", 3, min_s=1),
            Stage("fine", "stages_fake", 30, min_s=1),
            Stage("fine_later", "stages_fake", 30, min_s=1000),
        ),
    )
    out = tmp_path / "out"
    summary = driver.run_plan("fake", 60, out, tmp_path / "work", dry_run=False)
    stages = json.loads((out / "plan_fake.json").read_text())["stages"]
    assert stages == json.loads(json.dumps(summary["stages"]))
    assert "boom in the stage" in stages["boom"]["error"]
    assert stages["slow"]["status"] == "timed_out" and stages["slow"]["seconds"] < 30
    assert stages["fine"]["status"] == "ok" and stages["fine"]["result"] == {"value": 1}
    assert stages["fine_later"]["status"] == "skipped"  # needs more time than is left
    assert json.loads((out / "extra.json").read_text()) == [{"a": 1}]


def test_field_pair_plan_trains_raptb_subm_beside_the_fields_rl_method(tmp_path, monkeypatch):
    # the plan's cells and file, without training (the shared train_side_by_side is run by the
    # first plan's dry run above); the RL cell's flags build a valid run config
    monkeypatch.syspath_prepend(str(GPU))
    import stages_train
    import staging
    from context import StageContext
    from plans import PLANS

    from raptb.app.configuration.config import build_config

    assert [s.name for s in PLANS["field_pair"]] == ["environment", "field_pair"]
    assert staging.MODEL in staging.PLAN_PACKAGES["field_pair"]
    seen = []

    def fake(ctx, cells):
        seen.extend(cells)
        return [{**vars(c), "exit_code": 0, "eval_exit_code": 0} for c in cells]

    monkeypatch.setattr(stages_train, "train_side_by_side", fake)
    ctx = StageContext(work=tmp_path, budget_s=600, dry_run=True)
    result = stages_train.field_pair(ctx)
    rl = stages_train.FIELD_RL
    assert [(c.loss, c.replay) for c in seen] == [("raptb", "subm"), (rl, "none")]
    assert result["errors"] == [] and list(result["files"]) == ["field_smollm2.json"]
    flags = stages_train._flags(ctx, seen[1])
    overrides = {"loss": rl, "replay.kind": flags[flags.index("--replay") + 1], "model": "tiny"}
    assert build_config(overrides=overrides).replay.kind == "none"
