"""benchmarks/pretrained_step.py's table: each stage's medians side by side, its counted GFLOP,
and with --floor each side's seconds over the stage's floor (its FLOPs at the rate a thread; on
the wall clock, times the side's threads); with --product-floor each side's seconds over its own
products-alone floor of the stage."""

from __future__ import annotations

import argparse
import types

from tests.benchmarks import load_script


def _side(
    name: str, threads: int, totals: list[float], rollout: list[float]
) -> types.SimpleNamespace:
    runs = [
        {"cpu": {"rollout": r, "total": t}, "wall": t + 0.01, "tokens": 288}
        for r, t in zip(rollout, totals, strict=True)
    ]
    return types.SimpleNamespace(name=name, threads=threads, runs=runs, ready={"decode": "eager"})


def test_the_floor_column_divides_by_the_stages_flops_at_the_rate_times_the_threads():
    script = load_script("pretrained_step")
    one = _side("1 thread", 1, [9.0, 8.0, 10.0], [3.0, 2.0, 4.0])  # medians 9 and 3
    two = _side("2 threads", 2, [5.0, 6.0, 4.0], [2.0, 1.5, 2.5])  # medians 5 and 2
    counted = [
        {"flops": 4.0e11, "stages": {"rollout": 1.0e11, "total": 4.0e11}},
        {"flops": 4.0e11, "stages": {"rollout": 1.0e11, "total": 4.0e11}},
    ]
    args = argparse.Namespace(clock="wall", floor=50.0, product_floor=False)
    rows = script.table(args, "expr24", [one, two], counted)
    by_stage = {row.split(" | ")[0].lstrip("| "): row for row in rows if row.startswith("| ")}
    # rollout: 100 GFLOP at 50 GFLOP/s a thread: floor 2 s on one thread, 1 s on two
    assert by_stage["rollout"] == "| rollout | 3.00 | 2.00 | 1.50x | 100.0 | 1.50x | 2.00x |"
    # total: 400 GFLOP: floor 8 s on one thread, 4 s on two
    assert by_stage["total"] == "| total | 9.00 | 5.00 | 1.80x | 400.0 | 1.12x | 1.25x |"


def test_on_the_cpu_clock_the_floor_is_one_threads_rate_whatever_the_threads():
    script = load_script("pretrained_step")
    one = _side("1 thread", 1, [9.0], [3.0])
    two = _side("2 threads", 2, [10.0], [4.0])  # CPU seconds add both threads'
    counted = [{"flops": 4.0e11, "stages": {"rollout": 1.0e11, "total": 4.0e11}}] * 2
    args = argparse.Namespace(clock="cpu", floor=50.0, product_floor=False)
    rows = script.table(args, "smiles", [one, two], counted)
    rollout = next(row for row in rows if row.startswith("| rollout |"))
    assert rollout.endswith("| 1.50x | 2.00x |")
    assert "CPU s" in rows[0]
    # without --floor no floor columns
    plain = script.table(
        argparse.Namespace(clock="cpu", floor=None, product_floor=False),
        "smiles",
        [one, two],
        counted,
    )
    assert plain[0].count("|") == 6


def test_a_side_alone_has_no_ratio_column_and_its_floor():
    script = load_script("pretrained_step")
    one = _side("1 thread", 1, [9.0, 8.0, 10.0], [3.0, 2.0, 4.0])
    counted = [{"flops": 4.0e11, "stages": {"rollout": 1.0e11, "total": 4.0e11}}]
    rows = script.table(
        argparse.Namespace(clock="wall", floor=50.0, product_floor=False), "expr24", [one], counted
    )
    assert rows[0] == "| expr24: stage | 1 thread wall s | GFLOP | 1 thread / floor |"
    assert rows[1] == "|---|---|---|---|"
    assert "| rollout | 3.00 | 100.0 | 1.50x |" in rows
    assert "| total | 9.00 | 400.0 | 1.12x |" in rows
    assert "| wall | 9.01 | | |" in rows


def test_the_product_floor_column_divides_by_each_sides_own_stage_floor():
    script = load_script("pretrained_step")
    one = _side("1 thread", 1, [9.0, 8.0, 10.0], [3.0, 2.0, 4.0])  # medians 9 and 3
    two = _side("2 threads", 2, [5.0, 6.0, 4.0], [2.0, 1.5, 2.5])  # medians 5 and 2
    stages = {"rollout": 1.0e11, "total": 4.0e11}
    counted = [
        {"flops": 4.0e11, "stages": stages, "floor": {"rollout": 2.0, "total": 6.0}},
        {"flops": 4.0e11, "stages": stages, "floor": {"rollout": 1.6, "total": 4.0}},
    ]
    args = argparse.Namespace(clock="wall", floor=None, product_floor=True)
    rows = script.table(args, "smiles", [one, two], counted)
    assert rows[0].endswith("| 1 thread / product floor | 2 threads / product floor |")
    assert "| rollout | 3.00 | 2.00 | 1.50x | 100.0 | 1.50x | 1.25x |" in rows
    assert "| total | 9.00 | 5.00 | 1.80x | 400.0 | 1.50x | 1.25x |" in rows
    assert "| wall | 9.01 | 5.01 | 1.80x | | | |" in rows


def test_sides_that_count_other_work_each_have_their_own_floor():
    """A checkout against one that does less work in a stage (base / new GFLOP): each side's
    seconds over its own floor, the GFLOP cell showing both."""
    script = load_script("pretrained_step")
    base = _side("base", 1, [9.0], [3.0])
    new = _side("new", 1, [8.0], [2.0])
    counted = [
        {"flops": 4.0e11, "stages": {"rollout": 1.0e11, "total": 4.0e11}},
        {"flops": 3.5e11, "stages": {"rollout": 0.5e11, "total": 3.5e11}},
    ]
    args = argparse.Namespace(clock="wall", floor=50.0, product_floor=False)
    rows = script.table(args, "expr24", [base, new], counted)
    # rollout: 100 GFLOP (floor 2 s) on base, 50 (floor 1 s) on new
    assert "| rollout | 3.00 | 2.00 | 1.50x | 100.0 / 50.0 | 1.50x | 2.00x |" in rows
    assert "| total | 9.00 | 8.00 | 1.12x | 400.0 / 350.0 | 1.12x | 1.14x |" in rows
