"""benchmarks/thread_gain.py: a run of pretrained_step.py's threads comparison read back from the
table that script writes, kept once, and summarised over runs as the mean gain with its 95%
Student-t interval."""

from __future__ import annotations

import argparse
import math
import types

import pytest
from scipy import stats

from tests.benchmarks import load_script


def _side(name: str, threads: int, totals: list[float], rollout: list[float]) -> object:
    runs = [
        {"cpu": {"rollout: model + sampling": r, "total": t}, "wall": t + 0.01, "tokens": 288}
        for r, t in zip(rollout, totals, strict=True)
    ]
    return types.SimpleNamespace(name=name, threads=threads, runs=runs, ready={"decode": "eager"})


def _output(step_one: float, step_two: float, task: str = "smiles") -> str:
    """What pretrained_step.py --against-threads 2 --out writes, through its own table code."""
    script = load_script("pretrained_step")
    one = _side("1 thread", 1, [step_one, step_one + 1.0], [3.0, 3.0])
    two = _side("2 threads", 2, [step_two, step_two + 1.0], [2.0, 2.0])
    stages = {"rollout: model + sampling": 1.0e11, "total": 4.0e11}
    counted = [{"flops": 4.0e11, "stages": stages}] * 2
    args = argparse.Namespace(clock="wall", floor=50.0, product_floor=False)
    rows = script.table(args, task, [one, two], counted)
    command = (
        "Command: `python benchmarks/pretrained_step.py --against-threads 2`; 2026-12-05 01:29 "
        "UTC; CPU AMD EPYC, 2 cores; smollm2-135m, 128 rows a step (micro-batches of 32), 1 "
        "thread(s); load average at the start 0.1.\n"
    )
    return "\n".join([command, *rows, "Load average at the end 1.4."]) + "\n"


def test_a_run_is_read_back_from_the_table_the_step_script_writes():
    gain = load_script("thread_gain")
    rows = gain.parse(_output(20.0, 11.0), "abc1234")
    by_stage = {row["stage"]: row for row in rows}
    # the medians of [20, 21] and [11, 12]: the step's wall seconds add 0.01
    assert by_stage["wall"]["one_thread_s"] == "20.51"
    assert by_stage["wall"]["two_threads_s"] == "11.51"
    assert by_stage["rollout: model + sampling"]["two_threads_s"] == "2.00"
    assert set(by_stage) == {"rollout: model + sampling", "total", "wall"}  # no TFLOP, no tokens
    first = rows[0]
    assert (first["run"], first["commit"]) == ("2026-12-05 01:29", "abc1234")
    assert first["task"] == "smiles"
    assert first["machine"] == "2-core AMD EPYC"


def test_other_output_is_refused():
    gain = load_script("thread_gain")
    with pytest.raises(ValueError, match="Command"):
        gain.parse("| smiles: stage | 1 thread wall s |\n", "abc")
    base = _output(20.0, 11.0).replace("1 thread wall s | 2 threads wall s", "base wall s | new")
    with pytest.raises(ValueError, match="one thread against two"):
        gain.parse(base, "abc")


def test_a_run_is_kept_once(tmp_path):
    gain = load_script("thread_gain")
    path = tmp_path / "runs.csv"
    gain.append(gain.parse(_output(20.0, 11.0), "abc"), path)
    with pytest.raises(ValueError, match="already"):
        gain.append(gain.parse(_output(22.0, 12.0), "def"), path)
    other = _output(20.0, 11.0, task="expr24")
    gain.append(gain.parse(other, "abc"), path)
    assert len(path.read_text().splitlines()) == 1 + 2 * 3  # the header, three stages a task


def test_the_table_gives_the_mean_gain_over_runs_with_its_t_interval(tmp_path):
    gain = load_script("thread_gain")
    path = tmp_path / "runs.csv"
    steps = [(17.0, 10.0), (18.0, 10.0), (16.0, 10.0)]  # gains 1.7, 1.8, 1.6 (medians add 0.5)
    for i, (one, two) in enumerate(steps):
        text = _output(one - 0.51, two - 0.51).replace("01:29", f"0{i}:00")
        gain.append(gain.parse(text, "abc"), path)
    table = gain.thread_gain_table(path)
    step = next(line for line in table.splitlines() if line.startswith("| SMILES: the step |"))
    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)  # sd of 1.7, 1.8, 1.6 is 0.1
    one_run = stats.t.ppf(0.975, 2) * 0.1 * math.sqrt(1 + 1 / 3)
    assert step == (
        f"| SMILES: the step | 3 | 17.00 | 10.00 | 1.70 ± {half:.2f}x | 1.60-1.80x "
        f"| {1.7 - one_run:.2f}-{1.7 + one_run:.2f}x |"
    )
    rollout = next(line for line in table.splitlines() if "rollout" in line)
    assert "| 3 | 3.00 | 2.00 | 1.50 ± 0.00x | 1.50-1.50x |" in rollout
