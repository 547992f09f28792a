"""``raptb study`` end to end: a 1 x 2 x 2-seed toy study (2-step runs of the tiny model, 16
evaluation samples) with two workers: runs.csv rows, table.md layout, plots, resumption (nothing
re-runs; a run whose metrics are gone is evaluated again, alone), a failing run reported while
the study goes on, and --report-only."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app

ROOT = Path(__file__).resolve().parents[2]

TOY = """
title = "Toy study"
seeds = [0, 1]

[base]
steps = 2
checkpoint_every = 1
"replay.kind" = "rp"
optim = { batch_size = 8, grad_accum = 1 }

[axes]
loss = ["raptb"]

[rows]
base = {}
"higher lr" = { "optim.lr" = 3e-3 }

[eval]
samples = 16

[table]
rows = ["row"]
columns = ["loss"]
headers = { row = "Variant", loss = "Objective" }
labels = { loss = { tb = "TB", raptb = "RapTB" } }
metrics = [{ key = "acc", name = "Acc" }, { key = "train.log_z", name = "log Z", decimals = 2 }]
plots = ["acc"]
"""
BROKEN_ROW = '"broken" = { model = "/no/such/model/dir" }\n'
NAMES = [
    f"{loss}-{row}-s{seed}"
    for loss in ("raptb",)
    for row in ("base", "higher-lr")
    for seed in (0, 1)
]


def study(*args: str):
    return CliRunner().invoke(app, ["study", *args, "--no-progress"])


def stamps(runs: Path) -> dict[str, int]:
    return {n: (runs / n / "eval" / "metrics.json").stat().st_mtime_ns for n in NAMES}


@pytest.mark.slow
def test_toy_study_runs_reports_resumes_and_reports_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "toy.toml"
    path.write_text(TOY, encoding="utf-8")
    out = tmp_path / "out"
    first = study(str(path), "--workers", "2", "--out", str(out))
    assert first.exit_code == 0, first.output
    assert "4 runs to do" in first.output

    with (out / "runs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[:4] == ["loss", "row", "seed", "steps"]
    assert {"acc", "unique", "log_pterm", "train.log_z", "wall_seconds"} <= set(rows[0])
    assert [(r["loss"], r["row"], r["seed"], r["steps"]) for r in rows] == [
        (loss, row, str(seed), "2")
        for loss in ("raptb",)
        for row in ("base", "higher lr")
        for seed in (0, 1)
    ]
    assert all(0.0 <= float(r["acc"]) <= 1.0 and float(r["wall_seconds"]) > 0 for r in rows)

    text = (out / "table.md").read_text()
    assert text.startswith("# Toy study\n")
    header = "| Variant | n | Objective = RapTB Acc | Objective = RapTB log Z |"
    assert header in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[1:]] == ["| base", "| higher lr"]
    cell = r"-?\d+\.\d{3} ± \d+\.\d{3}"
    assert re.fullmatch(rf"\| base \| 2 \| {cell} \| -?\d+\.\d\d ± \d+\.\d\d \|", lines[1])
    assert "core CPU" in text and "Steps: 2 optimizer steps" in text
    assert (out / "acc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](acc.png)" in text
    config = (out / "runs" / "raptb-base-s0" / "config.toml").read_text()
    assert "batch_size = 8" in config and "threads = 1" in config

    runs = out / "runs"
    before = stamps(runs)
    second = study(str(path), "--workers", "2", "--out", str(out))
    assert second.exit_code == 0, second.output
    assert "nothing to run (4/4 runs done)" in second.output
    assert stamps(runs) == before

    (runs / "raptb-higher-lr-s1" / "eval" / "metrics.json").unlink()
    third = study(str(path), "--workers", "2", "--out", str(out))
    assert third.exit_code == 0, third.output
    assert "1 runs to do (3 done)" in third.output
    after = stamps(runs)
    changed = [n for n in NAMES if after[n] != before[n]]
    assert changed == ["raptb-higher-lr-s1"]

    path.write_text(TOY.replace("[eval]", BROKEN_ROW + "\n[eval]"), encoding="utf-8")
    broken = study(str(path), "--out", str(out), "--only", "row=broken,loss=raptb,seed=0")
    assert broken.exit_code == 1, broken.output
    assert "failed raptb-broken-s0: train exited with 2" in broken.output
    assert "1 of 6 runs failed" in broken.output
    assert "raptb-broken-s0" in (out / "table.md").read_text()  # listed as missing
    assert stamps(runs) == after

    (out / "runs.csv").unlink()
    (out / "table.md").unlink()
    path.write_text(TOY, encoding="utf-8")
    again = study(str(path), "--out", str(out), "--report-only")
    assert again.exit_code == 0, again.output
    with (out / "runs.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 4
    assert header in (out / "table.md").read_text()
    assert stamps(runs) == after


KILLED = """
title = "Killed study"
seeds = [0]

[base]
steps = 200
checkpoint_every = 100
"replay.kind" = "rp"
task = "custom"
custom = { reward = "tests.app.flaky_rewards:slow" }
optim = { batch_size = 4, grad_accum = 1 }

[axes]
loss = ["tb"]

[rows]
base = {}

[eval]
samples = 4

[table]
rows = ["row"]
columns = ["loss"]
metrics = [{ key = "acc", name = "Acc" }]
"""


def test_a_killed_studys_trainer_checkpoints_and_exits_and_the_rerun_resumes_it(tmp_path):
    """kill -9 of ``raptb study``: its trainer gets SIGTERM (parent-death signal), checkpoints
    and exits; the rerun plans to resume (or, without --resume, restart) the run instead of
    calling it a conflict or clearing it under a live trainer."""
    spec = tmp_path / "killed.toml"
    spec.write_text(KILLED)
    out, run = tmp_path / "out", tmp_path / "out" / "runs" / "tb-base-s0"
    args = ["study", str(spec), "--out", str(out), "--no-progress"]
    code = "from raptb.app.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env)
    deadline = time.monotonic() + 240
    while not (run / "metrics.jsonl").is_file() or not (run / ".lock.pid").is_file():
        assert time.monotonic() < deadline and proc.poll() is None, "no trainer started"
        time.sleep(0.05)
    trainer = int((run / ".lock.pid").read_text())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120
    try:
        while Path(f"/proc/{trainer}").exists() and "Z" not in _state(trainer):
            assert time.monotonic() < deadline, "the trainer outlived its study"
            time.sleep(0.05)
    finally:
        if "Z" not in _state(trainer):
            os.kill(trainer, signal.SIGKILL)  # no orphan left running when the test fails
    assert not (run / ".lock.pid").exists()  # it ended through its stop path
    assert (run / "config.toml").is_file() and list((run / "checkpoints").glob("step-*"))

    for flag, action in (("--resume", "resume"), ("--no-resume", "restart")):
        done = CliRunner().invoke(app, [*args[:-1], flag, "--dry-run"])
        assert done.exit_code == 0, done.output
        assert re.search(rf"tb-base-s0\s+{action}", done.output), done.output


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"
