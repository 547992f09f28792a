"""benchmarks/expr24_grid.py: grid selection, run planning, and a tiny end-to-end grid
(2 cells, 1 seed, 2 steps, 32 samples): csv columns and rows, the CI table, skipping finished
runs on a second invocation, and --report-only."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "expr24_grid.py"


def load_grid():
    spec = importlib.util.spec_from_file_location("expr24_grid", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["expr24_grid"] = module
    spec.loader.exec_module(module)
    return module


grid = load_grid()


def test_full_grid_has_42_runs_in_the_papers_order():
    runs = grid.grid_runs(grid.parse_cells(None), grid.parse_seeds("0,1,2"))
    assert len(runs) == 42
    cells = grid.grid_cells()
    assert cells[:3] == [("prt", "tb"), ("prt", "subtb"), ("prt", "raptb")]
    assert cells[3:8] == [
        ("rp", "tb"),
        ("rp", "subtb"),
        ("rp", "raptb"),
        ("rp", "avg_prefix_tb"),
        ("rp", "root_subtb_logz"),
    ]
    assert cells[-1] == ("oracle", "raptb")


def test_parse_cells_filters_and_rejects_unknown():
    assert grid.parse_cells("raptb:subm,tb:rp") == [("rp", "tb"), ("subm", "raptb")]
    assert grid.parse_cells("*:oracle") == [("oracle", o) for o in ("tb", "subtb", "raptb")]
    with pytest.raises(ValueError):
        grid.parse_cells("avg_prefix_tb:subm")
    with pytest.raises(ValueError):
        grid.parse_cells("tb-rp")
    with pytest.raises(ValueError):
        grid.parse_seeds("a,b")


def fake_run_dir(path: Path, *, steps: int, checkpoint: int, loss="tb", replay="rp", seed=0):
    path.mkdir(parents=True)
    (path / "config.toml").write_text(
        f'task = "expr24"\nloss = "{loss}"\nseed = {seed}\nsteps = {steps}\n'
        f'[replay]\nkind = "{replay}"\n'
    )
    (path / "checkpoints" / f"step-{checkpoint:06d}").mkdir(parents=True)


def test_plan_resume_eval_done_and_conflicts(tmp_path):
    run = grid.Run("rp", "tb", 0)
    assert grid.plan_run(run, tmp_path / "none", 10, 32).action == "fresh"

    fake_run_dir(tmp_path / "partial", steps=10, checkpoint=4)
    plan = grid.plan_run(run, tmp_path / "partial", 10, 32)
    assert (plan.action, plan.step) == ("resume", 4)
    command = grid.train_command(run, tmp_path / "partial", 10, 1, ["--batch-size", "8"], True)
    assert command[:4] == ["train", "--resume", "--out", str(tmp_path / "partial")]
    assert command[-3:] == ["--no-progress", "--batch-size", "8"]

    fake_run_dir(tmp_path / "trained", steps=10, checkpoint=10)
    assert grid.plan_run(run, tmp_path / "trained", 10, 32).action == "eval"
    (tmp_path / "trained" / "eval").mkdir()
    metrics = {"n_samples": 32, "eval": {"step": 10}}
    (tmp_path / "trained" / "eval" / "metrics.json").write_text(json.dumps(metrics))
    assert grid.plan_run(run, tmp_path / "trained", 10, 32).action == "done"
    # other N: evaluate again without retraining; other steps: refuse to touch the run
    assert grid.plan_run(run, tmp_path / "trained", 10, 64).action == "eval"
    assert grid.plan_run(run, tmp_path / "trained", 20, 32).action == "conflict"
    assert grid.plan_run(grid.Run("rp", "raptb", 0), tmp_path / "trained", 10, 32).action == (
        "conflict"
    )


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_tiny_grid_end_to_end(tmp_path):
    out, report = tmp_path / "runs", tmp_path / "results"
    common = [
        "--cells",
        "tb:rp,raptb:subm",
        "--seeds",
        "0",
        "--steps",
        "2",
        "--samples",
        "32",
        "--out",
        str(out),
        "--report-dir",
        str(report),
        "--extra-train-args=--batch-size 8 --grad-accum 1",
        "--no-progress",
    ]
    first = run_script(*common)
    assert first.returncode == 0, first.stderr

    with (report / "expr24_grid.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == grid.CSV_COLUMNS
    assert [(r["replay"], r["objective"], r["seed"], r["steps"]) for r in rows] == [
        ("rp", "tb", "0", "2"),
        ("subm", "raptb", "0", "2"),
    ]
    assert all(float(r["wall_seconds"]) > 0 for r in rows)
    assert all(0.0 <= float(r["acc"]) <= 1.0 for r in rows)

    text = (report / "expr24_grid.md").read_text()
    assert "| Replay | Objective | n | Acc | Unique | CovCount | NormCov |" in text
    assert "## Termination diagnostic" in text and "L = 9" in text
    assert "| RP | TB | 1 |" in text and "| SubM | RapTB | 1 |" in text
    assert "## Comparison with the paper" in text
    assert "2-core CPU, 24 GiB" in text
    for png in (grid.COVERAGE_PNG, grid.PTERM_PNG):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text
    config = (out / "rp-tb-s0" / "config.toml").read_text()
    assert "batch_size = 8" in config and "threads = 1" in config

    metrics = [out / name / "eval" / "metrics.json" for name in ("rp-tb-s0", "subm-raptb-s0")]
    stamps = [path.stat().st_mtime_ns for path in metrics]
    second = run_script(*common)
    assert second.returncode == 0, second.stderr
    assert "nothing to run" in second.stderr
    assert [path.stat().st_mtime_ns for path in metrics] == stamps

    (report / "expr24_grid.csv").unlink()
    (report / "expr24_grid.md").unlink()
    again = run_script(*common, "--report-only")
    assert again.returncode == 0, again.stderr
    with (report / "expr24_grid.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 2
    assert "| RP | TB | 1 |" in (report / "expr24_grid.md").read_text()
    assert [path.stat().st_mtime_ns for path in metrics] == stamps
