"""Reward failures counted and grouped, a stop after max_failed_steps, a pool equal to serial."""

from __future__ import annotations

import json
import time

import pytest

from raptb.adapters.tasks.custom.task import CustomTask, load_callable
from raptb.adapters.tasks.expr24.task import Expr24Task
from raptb.adapters.tasks.smiles.task import DEFAULT_SCAFFOLD, SmilesTask
from raptb.app.reward.calls import RewardCaller, RewardFailure
from tests.app.test_crash_safety import records, run_main

REWARDS = "tests.app.flaky_rewards"
RUN = [
    "train", "--task", "custom", "--replay", "none", "--batch-size", "8", "--grad-accum", "1",
    "--threads", "1", "--no-progress",
]  # fmt: skip


def test_raising_and_nan_rewards_are_counted_and_grouped(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*RUN, "--reward", f"{REWARDS}:flaky", "--steps", "3", "--out", str(run)]
    code, err = run_main(args, capsys)
    assert code == 0, err
    rows = records(run)
    assert sum(r["reward_errors"] for r in rows) > 0
    assert sum(r["reward_nonfinite"] for r in rows) > 0
    lines = err.splitlines()
    per_step = [line for line in lines if line.startswith("warning: step ")]
    # at most one line per step and kind: KeyError, ValueError, non-finite
    assert 3 <= len(per_step) <= 9, err
    assert any("raised KeyError on" in line for line in per_step)
    assert any("returned a non-finite value on" in line for line in per_step)
    assert any("raised ValueError" in line and "in total" in line for line in lines)
    assert any("non-finite values in total" in line for line in lines)


def test_a_reward_failing_everywhere_stops_the_run(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("[reward]\nmax_failed_steps = 2\n")
    run = tmp_path / "run"
    args = [*RUN, "--reward", f"{REWARDS}:always_raises", "--config", str(config)]
    code, err = run_main([*args, "--steps", "20", "--out", str(run)], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the reward {REWARDS}:always_raises failed on every call")
    assert "2 consecutive steps" in last and "max_failed_steps" in last
    assert [r["reward_errors"] > 0 for r in records(run)] == [True]  # step 1 logged, 2 stopped


def tasks() -> list:
    return [
        Expr24Task(),
        SmilesTask([DEFAULT_SCAFFOLD]),
        CustomTask(load_callable(f"{REWARDS}:flaky")),
    ]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_pool_scores_equal_serial_scores(index):
    task = tasks()[index]
    texts = ["", "1", "4*6", "(1+2)*8", "CO", "C(=O)N", "c1ccccc1", "aab", "ab", "abaa", "4*6"]
    serial = RewardCaller(task)
    pooled = RewardCaller(task, workers=2)
    try:
        assert pooled.score_many("", texts) == serial.score_many("", texts)
        assert pooled.take_counts(1) == serial.take_counts(1)
    finally:
        pooled.close()


def test_a_slow_reward_runs_about_n_times_faster_in_a_pool():
    task = CustomTask(load_callable(f"{REWARDS}:slow"))
    texts = [f"{'a' * i}b" for i in range(16)]
    pooled = RewardCaller(task, workers=4)
    try:
        # the pool starts its workers on demand: start all four outside the timing
        pooled.score_many("", [f"warm-{i}" for i in range(16)])
        start = time.perf_counter()
        pooled_scores = pooled.score_many("", texts)
        pooled_time = time.perf_counter() - start
    finally:
        pooled.close()
    start = time.perf_counter()
    serial_scores = RewardCaller(task).score_many("", texts)
    serial_time = time.perf_counter() - start
    assert pooled_scores == serial_scores
    # ideally 4x; the chunks' round trips and a busy machine take some of it
    assert serial_time / pooled_time > 2.5, (serial_time, pooled_time)


def test_an_unpicklable_reward_cannot_use_workers():
    task = CustomTask(lambda prompt, text: 1.0)
    with pytest.raises(RewardFailure, match="workers = 0"):
        RewardCaller(task, workers=2).score_many("", ["a", "b"])


def test_training_with_workers_logs_what_serial_training_logs(tmp_path, capsys):
    logs = []
    for workers in (0, 2):
        config = tmp_path / f"w{workers}.toml"
        config.write_text(f"[reward]\nworkers = {workers}\n")
        run = tmp_path / f"w{workers}"
        args = [*RUN, "--reward", f"{REWARDS}:flaky", "--config", str(config), "--steps", "2"]
        code, err = run_main([*args, "--out", str(run)], capsys)
        assert code == 0, err
        logs.append([{k: v for k, v in r.items() if k != "seconds"} for r in records(run)])
    assert logs[0] == logs[1]
    assert json.dumps(logs[0])  # plain JSON values
