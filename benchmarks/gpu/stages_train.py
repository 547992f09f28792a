"""Training stages of the GPU plans: the headline pair of issue 20, the next missing cells of the
SmolLM2-135M tables, and RapTB + SubM against the field's best RL method, as ``raptb train`` runs
side by side on the one GPU.

Every run is the CLI itself (``python -m raptb train ... --time-limit M``), so a run stopped by
the clock is checkpointed and evaluated like a finished one; then ``raptb eval RUN --exact``
(Expr24's exact metrics over the enumerated solution set; a dry run samples 32 texts with ``raptb
eval`` instead, since enumerating Y* takes over a minute on a CPU). A row per run: its cell, the
steps it did, its steps per second, its last logged step and its evaluation's numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from context import StageContext

EVAL_RESERVE_S = 90.0
"""Seconds kept for the exact evaluations after the time limit (dry run: a tenth)."""
REGIMES = {"logz_trained": {}, "logz_frozen": {"optim.log_z_lr": 0.0, "optim.log_z_init": 0.0}}
"""The two log Z regimes of ../shared/spec/reproduction.md: the objective as written, and the
paper's released behaviour (log Z held at 0)."""
TABLE_CELLS = (
    ("tb", "rp"),
    ("tb", "subm"),
    ("raptb", "rp"),
    ("raptb", "subm"),
    ("subtb", "subm"),
    ("root_subtb_logz", "subm"),
)
"""Issue 20's Expr24 rows: (loss, replay)."""
SEEDS = (0, 1, 2)
TABLE_STEPS = 300
"""Steps of every table cell (the budget stated beside the table; the same for every cell)."""
COMMITTED = Path("benchmarks/results/gpu/expr24_smollm2.json")
PARALLEL = 6


@dataclass(frozen=True)
class Cell:
    loss: str
    replay: str
    seed: int = 0
    regime: str = "logz_trained"
    steps: int = 5000

    def name(self) -> str:
        return f"{self.loss}-{self.replay}-s{self.seed}-{self.regime}"


def _flags(ctx: StageContext, cell: Cell) -> list[str]:
    model = "tiny" if ctx.dry_run else "smollm2-135m"
    steps = 2 if ctx.dry_run else cell.steps
    flags = ["--task", "expr24", "--model", model, "--loss", cell.loss, "--replay", cell.replay]
    flags += ["--seed", str(cell.seed), "--steps", str(steps), "--checkpoint-every", "100"]
    if ctx.dry_run:
        flags += ["--batch-size", "4", "--grad-accum", "1", "--threads", "1"]
        flags += ["--eval_samples", "64"]
    for path, value in REGIMES[cell.regime].items():
        flags += [f"--{path}", str(value)]
    return flags


def _row(run: Path, cell: Cell, code: int, eval_code: int | None) -> dict[str, Any]:
    lines = (run / "metrics.jsonl").read_text().splitlines() if run.is_dir() else []
    records = [json.loads(line) for line in lines]
    seconds = sum(r.get("seconds", 0.0) for r in records)
    exact, sampled = run / "eval" / "exact.json", run / "eval" / "metrics.json"
    scalars = {}
    if sampled.is_file():
        scalars = {k: v for k, v in json.loads(sampled.read_text()).items() if _scalar(v)}
    return {
        **asdict(cell),
        "exit_code": code,
        "steps_done": len(records),
        "steps_per_s": len(records) / seconds if seconds else None,
        "last": records[-1] if records else None,
        "exact": json.loads(exact.read_text()) if exact.is_file() else None,
        "sampled": scalars or None,
        "eval_exit_code": eval_code,
    }


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, int | float | str | bool)


def _wait(ctx: StageContext, process: subprocess.Popen[bytes], keep_s: float) -> int | None:
    """``process``'s exit code; when it runs into the last ``keep_s`` seconds of the stage, a
    SIGTERM (a training run checkpoints and exits 143), then SIGKILL 15 s later (None)."""
    try:
        return process.wait(timeout=max(ctx.seconds_left() - keep_s, 1.0))
    except subprocess.TimeoutExpired:
        process.terminate()
    try:
        return process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def train_side_by_side(ctx: StageContext, cells: list[Cell]) -> list[dict[str, Any]]:
    """``cells`` trained at once under one time limit, then evaluated exactly, at once."""
    reserve = EVAL_RESERVE_S / (10 if ctx.dry_run else 1)
    minutes = max(ctx.seconds_left() - reserve, 1.0) / 60
    runs = {cell: ctx.work / cell.name() for cell in cells}
    logs = {cell: (ctx.work / f"{cell.name()}.log").open("w") for cell in cells}
    raptb = [sys.executable, "-m", "raptb"]
    trainings = {
        cell: subprocess.Popen(
            [
                *raptb,
                "train",
                *_flags(ctx, cell),
                "--out",
                str(run),
                "--no-progress",
                "--time-limit",
                f"{minutes:.3f}",
            ],
            stdout=logs[cell],
            stderr=subprocess.STDOUT,
        )
        for cell, run in runs.items()
    }
    codes = {cell: _wait(ctx, p, reserve / 2) for cell, p in trainings.items()}
    how = ["--samples", "32"] if ctx.dry_run else ["--exact"]
    evals = {
        cell: subprocess.Popen(
            [*raptb, "eval", str(run), *how], stdout=logs[cell], stderr=subprocess.STDOUT
        )
        for cell, run in runs.items()
        if codes[cell] == 0
    }
    eval_codes = {cell: _wait(ctx, p, 5.0) for cell, p in evals.items()}
    for cell, log in logs.items():
        log.close()
        print(f"--- {cell.name()}\n{(ctx.work / f'{cell.name()}.log').read_text()[-3000:]}")
    rows = [_row(runs[c], c, codes[c], eval_codes.get(c)) for c in cells]
    model = _flags(ctx, cells[0])[3]
    return [row | {"model": model, "dry_run": ctx.dry_run} for row in rows]


def errors(rows: list[dict[str, Any]]) -> list[str]:
    """A line per run whose training or exact evaluation did not exit 0."""
    return [
        f"{Cell(r['loss'], r['replay'], r['seed'], r['regime']).name()}: train exit "
        f"{r['exit_code']}, eval exit {r['eval_exit_code']}"
        for r in rows
        if r["exit_code"] != 0 or r["eval_exit_code"] != 0
    ]


def headline_pair(ctx: StageContext) -> dict[str, Any]:
    """RapTB + SubM against TB + RP on SmolLM2-135M, side by side under one wall-clock limit."""
    rows = train_side_by_side(ctx, [Cell("raptb", "subm"), Cell("tb", "rp")])
    return {"runs": rows, "errors": errors(rows), "files": {"headline_smollm2.json": rows}}


FIELD_RL = "g2rpo"
"""The best RL method of the Expr24 comparison (docs/rl-baselines.md, "The field side by side"):
raptb's reading of G²RPO, more accurate than RapTB + SubM at 1500 steps on the embedded model at
as broad a coverage (ten seeds: exact Acc 0.971 with 465 expected distinct, against 0.837 with
396); the one the ``field_pair`` plan runs against RapTB + SubM on the real model."""


def field_pair(ctx: StageContext) -> dict[str, Any]:
    """RapTB + SubM against ``FIELD_RL`` on SmolLM2-135M, side by side at equal minutes (one
    wall-clock limit), each evaluated exactly: does the comparison's ordering hold on a
    pretrained model?"""
    rows = train_side_by_side(ctx, [Cell("raptb", "subm"), Cell(FIELD_RL, "none")])
    return {"runs": rows, "errors": errors(rows), "files": {"field_smollm2.json": rows}}


def missing_cells(done: list[dict[str, Any]]) -> list[Cell]:
    """The table's cells (both log Z regimes, ``SEEDS``) that no committed row holds, in order:
    seed by seed, so that every slot completes whole seeds of the table first."""
    have = {(r["loss"], r["replay"], r["seed"], r["regime"], r["steps"]) for r in done}
    return [
        Cell(loss, replay, seed, regime, TABLE_STEPS)
        for seed in SEEDS
        for regime in REGIMES
        for loss, replay in TABLE_CELLS
        if (loss, replay, seed, regime, TABLE_STEPS) not in have
    ]


def next_cells(ctx: StageContext) -> dict[str, Any]:
    """The next ``PARALLEL`` missing cells of the SmolLM2 Expr24 table (``COMMITTED``)."""
    done = json.loads(COMMITTED.read_text()) if COMMITTED.is_file() else []
    todo = missing_cells(done)[: 2 if ctx.dry_run else PARALLEL]
    rows = train_side_by_side(ctx, todo)
    complete = [r for r in rows if r["steps_done"] >= (2 if ctx.dry_run else TABLE_STEPS)]
    return {
        "runs": rows,
        "errors": errors(rows),
        "left": len(missing_cells(done)) - len(complete),
        "files": {"expr24_smollm2.json": complete},
    }
