"""Expr24 replay x objective grid: train, evaluate and report with 95% confidence intervals.

Reproduces the paper's Expr24 study ("Expr24 results under different replay schemes" and the
termination diagnostic) with this implementation on CPU:

    replay {prt, rp, subm, oracle} x objective {tb, subtb, raptb}
    + avg_prefix_tb and root_subtb_logz under rp
    x seeds (default 0, 1, 2)                                   = 42 runs

Every run is two child processes, ``raptb train ... --no-progress`` then ``raptb eval RUN
--samples N --seed SEED --json``, ``--jobs`` runs at a time, each with ``--threads`` torch
threads. One run directory per run under ``--out`` (``<replay>-<objective>-s<seed>``); the
children's output goes to ``grid-train.log`` / ``grid-eval.log`` in it, and ``grid.json``
records the cell, steps, samples and the wall time of training and evaluation.

Resumable: a run whose ``eval/metrics.json`` comes from a checkpoint at the requested steps with
the requested number of samples is skipped; a run whose training stopped early continues with
``raptb train --resume --out RUN``; a trained run without (matching) metrics is only evaluated.
Ctrl-C forwards one interrupt to the children (training finishes its step and checkpoints), so
running the same command again picks up where it stopped.

After the runs (or with ``--report-only``) it writes, under ``--report-dir``:

    expr24_grid.csv            one row per run
    expr24_grid.md             mean +- 95% CI per cell (t-interval over seeds), termination
                               diagnostic by length, plots, placeholder for the comparison
    expr24_grid_coverage.png   CovCount per cell with CI error bars
    expr24_grid_log_pterm.png  log p_term per cell with CI error bars

Examples:

    python benchmarks/expr24_grid.py                      # the full grid, 1000 steps
    python benchmarks/expr24_grid.py --dry-run            # what would run, nothing started
    python benchmarks/expr24_grid.py --cells tb:rp,raptb:subm --seeds 0 --steps 2 --samples 32 \\
        --extra-train-args="--batch-size 8 --grad-accum 1"
    python benchmarks/expr24_grid.py --report-only        # csv/md/plots from existing runs
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from raptb.core.metrics import mean_ci

REPO = Path(__file__).resolve().parent.parent
REPLAYS = ("prt", "rp", "subm", "oracle")
OBJECTIVES = ("tb", "subtb", "raptb")
EXTRA_CELLS = (("rp", "avg_prefix_tb"), ("rp", "root_subtb_logz"))
REPLAY_LABELS = {"prt": "PRT", "rp": "RP", "subm": "SubM", "oracle": "Oracle"}
OBJECTIVE_LABELS = {
    "tb": "TB",
    "subtb": "SubTB",
    "raptb": "RapTB",
    "avg_prefix_tb": "AvgPrefixTB",
    "root_subtb_logz": "RootSubTBLogZ",
}
CSV_COLUMNS = (
    "replay",
    "objective",
    "seed",
    "steps",
    "acc",
    "unique",
    "cov_count",
    "norm_cov",
    "kl_pi_p",
    "kl_p_pi",
    "js_tok",
    "log_pterm",
    "len_mean",
    "wall_seconds",
)
# (metrics.json key, column header, decimals) in the paper's table layout
TABLE_METRICS = (
    ("acc", "Acc", 3),
    ("unique", "Unique", 1),
    ("cov_count", "CovCount", 1),
    ("norm_cov", "NormCov", 3),
    ("kl_pi_p", "KL(π‖p*)", 3),
    ("kl_p_pi", "KL(p*‖π)", 3),
    ("js_tok", "JS", 3),
    ("log_pterm", "log p_term", 3),
    ("len_mean", "Len", 2),
)
TERMINATION_LENGTHS = (3, 5, 7, 9)
DEFAULT_OUT = REPO / "benchmarks" / "results" / "expr24_grid_runs"
DEFAULT_REPORT_DIR = REPO / "benchmarks" / "results"
CSV_NAME = "expr24_grid.csv"
MD_NAME = "expr24_grid.md"
COVERAGE_PNG = "expr24_grid_coverage.png"
PTERM_PNG = "expr24_grid_log_pterm.png"
RECORD = "grid.json"
METRICS = Path("eval") / "metrics.json"
# share of a run's wall time spent in evaluation, for the progress estimate only
EVAL_SHARE = 0.1
# entry point of the ``raptb`` console script, run with this interpreter; Ctrl-C handling is
# restored because a driver started in the background (``... &``) passes SIGINT on as ignored
RAPTB = (
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'raptb'; from raptb.app.cli import main; main()",
)


# --------------------------------------------------------------------------------------- grid


@dataclass(frozen=True, order=True)
class Run:
    replay: str
    objective: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.replay}-{self.objective}-s{self.seed}"

    @property
    def label(self) -> str:
        return f"{REPLAY_LABELS[self.replay]}/{OBJECTIVE_LABELS[self.objective]} s{self.seed}"


def grid_cells() -> list[tuple[str, str]]:
    """(replay, objective) in the report's order: replays grouped, extra objectives under RP."""
    cells = []
    for replay in REPLAYS:
        cells.extend((replay, objective) for objective in OBJECTIVES)
        cells.extend(cell for cell in EXTRA_CELLS if cell[0] == replay)
    return cells


def parse_cells(spec: str | None) -> list[tuple[str, str]]:
    """``objective:replay`` items separated by commas (``*`` matches any), in grid order.

    ``None`` or ``""`` selects the whole grid. Raises ValueError for an item that selects no
    cell of the grid.
    """
    cells = grid_cells()
    if not spec:
        return cells
    chosen: set[tuple[str, str]] = set()
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        objective, sep, replay = item.partition(":")
        if not sep:
            raise ValueError(f"--cells: '{item}' is not objective:replay (e.g. tb:rp)")
        matched = [(r, o) for r, o in cells if objective in ("*", o) and replay in ("*", r)]
        if not matched:
            raise ValueError(f"--cells: '{item}' is not a cell of the grid")
        chosen.update(matched)
    return [cell for cell in cells if cell in chosen]


def parse_seeds(spec: str) -> list[int]:
    try:
        seeds = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--seeds: '{spec}' is not a comma-separated list of integers") from None
    if not seeds:
        raise ValueError("--seeds: no seed given")
    return seeds


def grid_runs(cells: Iterable[tuple[str, str]], seeds: Iterable[int]) -> list[Run]:
    seeds = list(seeds)
    return [Run(replay, objective, seed) for replay, objective in cells for seed in seeds]


# ---------------------------------------------------------------------------- run directories


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _read_config(run_dir: Path) -> dict[str, Any] | None:
    try:
        return tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None


def latest_step(run_dir: Path) -> int | None:
    """Step of the newest complete checkpoint (``checkpoints/step-NNNNNN``), or None."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    steps = [
        int(p.name[5:])
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()
    ]
    return max(steps) if steps else None


def read_record(run_dir: Path) -> dict[str, Any]:
    return _read_json(run_dir / RECORD) or {}


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / RECORD)


@dataclass(frozen=True)
class Plan:
    """What a run needs: done, eval (trained, not evaluated), resume, fresh, or conflict."""

    action: str
    step: int | None = None
    reason: str = ""


def plan_run(run: Run, run_dir: Path, steps: int, samples: int) -> Plan:
    step = latest_step(run_dir)
    if step is None:
        return Plan("fresh")
    config = _read_config(run_dir)
    if config is None:
        return Plan("conflict", step, "has checkpoints but no readable config.toml")
    found = (
        config.get("loss"),
        config.get("replay", {}).get("kind"),
        config.get("seed"),
        config.get("task", "expr24"),
    )
    if found != (run.objective, run.replay, run.seed, "expr24"):
        return Plan("conflict", step, f"holds another run (loss, replay, seed, task = {found})")
    if config.get("steps") != steps or step > steps:
        return Plan(
            "conflict",
            step,
            f"trained for steps = {config.get('steps')} (checkpoint {step}), not {steps}; "
            "choose another --out",
        )
    if step < steps:
        return Plan("resume", step)
    metrics = _read_json(run_dir / METRICS)
    if (
        metrics is not None
        and metrics.get("eval", {}).get("step") == steps
        and metrics.get("n_samples") == samples
    ):
        return Plan("done", step)
    return Plan("eval", step)


def train_command(
    run: Run, run_dir: Path, steps: int, threads: int, extra: Sequence[str], resume: bool
) -> list[str]:
    if resume:
        head = ["train", "--resume", "--out", str(run_dir)]
    else:
        head = [
            "train",
            "--task",
            "expr24",
            "--loss",
            run.objective,
            "--replay",
            run.replay,
            "--seed",
            str(run.seed),
            "--out",
            str(run_dir),
        ]
    return [*head, "--steps", str(steps), "--threads", str(threads), "--no-progress", *extra]


def eval_command(run: Run, run_dir: Path, samples: int) -> list[str]:
    return ["eval", str(run_dir), "--samples", str(samples), "--seed", str(run.seed), "--json"]


# ------------------------------------------------------------------------------------ runner


@dataclass
class Job:
    run: Run
    run_dir: Path
    phase: str  # "train" | "eval"
    process: subprocess.Popen[bytes]
    log: IO[str]
    started: float
    start_step: int = 0
    step: int = 0
    log_offset: int = 0
    task: TaskID | None = None


@dataclass
class Grid:
    """Runs the planned runs ``jobs`` at a time and tracks progress over the whole grid."""

    runs: list[Run]
    out: Path
    steps: int
    samples: int
    jobs: int
    threads: int
    extra: list[str]
    command: str
    console: Console
    show_progress: bool
    done: int = 0
    failed: list[tuple[Run, str]] = field(default_factory=list)
    pending: list[tuple[Run, Plan]] = field(default_factory=list)
    running: list[Job] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    total_work: float = 0.0  # runs' worth of work this invocation has to do (fractional)
    work_done: float = 0.0  # ... of which finished
    stopping: bool = False

    def run_dir(self, run: Run) -> Path:
        return self.out / run.name

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.threads)
        env.update(
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        return env

    # --- child processes ---------------------------------------------------------------------

    def _spawn(self, run: Run, phase: str, args: list[str], start_step: int) -> Job:
        run_dir = self.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = (run_dir / f"grid-{phase}.log").open("a", encoding="utf-8")
        log.write(f"\n# {datetime.now().isoformat(timespec='seconds')} raptb {shlex.join(args)}\n")
        log.flush()
        process = subprocess.Popen(
            [*RAPTB, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            # own session: a Ctrl-C at the terminal reaches the driver only, which forwards
            # exactly one SIGINT (a second one would abort the trainer mid-step)
            start_new_session=True,
        )
        metrics_log = run_dir / "metrics.jsonl"
        offset = metrics_log.stat().st_size if metrics_log.is_file() else 0
        return Job(
            run, run_dir, phase, process, log, time.monotonic(), start_step, start_step, offset
        )

    def _start(self, run: Run, plan: Plan) -> Job:
        run_dir = self.run_dir(run)
        record = read_record(run_dir)
        if plan.action == "fresh":
            # a fresh start must not append to a log left by an attempt that never checkpointed
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
            record = {}
        record.update(
            replay=run.replay,
            objective=run.objective,
            seed=run.seed,
            steps=self.steps,
            samples=self.samples,
            threads=self.threads,
            jobs=self.jobs,
            extra_train_args=self.extra,
            command=self.command,
        )
        if plan.action != "eval":  # a run trained elsewhere keeps an unknown training time
            record.setdefault("train_seconds", 0.0)
        write_record(run_dir, record)
        if plan.action == "eval":
            return self._spawn(run, "eval", eval_command(run, run_dir, self.samples), self.steps)
        args = train_command(
            run, run_dir, self.steps, self.threads, self.extra, resume=plan.action == "resume"
        )
        return self._spawn(run, "train", args, plan.step or 0)

    def _poll_steps(self, job: Job) -> None:
        """Advance ``job.step`` by the lines appended to the run's metrics.jsonl."""
        path = job.run_dir / "metrics.jsonl"
        try:
            with path.open("rb") as handle:
                handle.seek(job.log_offset)
                chunk = handle.read()
        except OSError:
            return
        complete = chunk.rfind(b"\n") + 1
        job.log_offset += complete
        job.step = min(self.steps, job.step + chunk[:complete].count(b"\n"))

    def _weight(self, start_step: int) -> float:
        """A run's work from ``start_step`` on, in runs (one run: all steps plus its eval)."""
        return (1.0 - EVAL_SHARE) * (self.steps - start_step) / self.steps + EVAL_SHARE

    def _fraction(self, job: Job) -> float:
        """Work of the job's run done in this invocation so far, in runs."""
        step = self.steps if job.phase == "eval" else job.step
        return (1.0 - EVAL_SHARE) * (step - job.start_step) / self.steps

    def _finish(self, job: Job) -> Job | None:
        """Handle a child that exited; return the follow-up job (eval after train) if any."""
        job.log.close()
        seconds = time.monotonic() - job.started
        record = read_record(job.run_dir)
        key = f"{job.phase}_seconds"
        record[key] = (record.get(key) or 0.0) + seconds if job.phase == "train" else seconds
        write_record(job.run_dir, record)
        code = job.process.returncode
        log_name = job.run_dir / f"grid-{job.phase}.log"
        if self.stopping:
            return None
        if code != 0:
            return self._fail(job, f"{job.phase} exited with {code}; see {log_name}")
        if job.phase == "train":
            step = latest_step(job.run_dir)
            if step != self.steps:
                return self._fail(job, f"training stopped at step {step}/{self.steps}")
            follow = self._spawn(
                job.run, "eval", eval_command(job.run, job.run_dir, self.samples), job.start_step
            )
            self._note(f"start eval {job.run.label}")
            return follow
        self.work_done += self._weight(job.start_step)
        self.done += 1
        wall = (record.get("train_seconds") or 0.0) + seconds
        self._note(f"done {job.run.label} in {_hms(wall)} ({self._counts()}, {self._eta()})")
        return None

    def _fail(self, job: Job, reason: str) -> None:
        self.failed.append((job.run, reason))
        self.work_done += self._weight(job.start_step)
        self._note(f"[red]failed[/] {job.run.label}: {reason}")

    # --- progress ---------------------------------------------------------------------------

    def _counts(self) -> str:
        return f"{self.done}/{len(self.runs)} runs"

    def _eta(self) -> str:
        work = self.work_done + sum(self._fraction(job) for job in self.running)
        if work <= 0.01 * self.total_work:
            return "ETA -"
        seconds = (time.monotonic() - self.started) / work * max(0.0, self.total_work - work)
        return f"ETA {_hms(seconds)}"

    def _note(self, message: str) -> None:
        elapsed = _hms(time.monotonic() - self.started)
        self.console.print(f"[{elapsed}] {message}", highlight=False)

    def _describe(self, job: Job) -> str:
        if job.phase == "train":
            return f"{job.run.label}: train {job.step}/{self.steps}"
        return f"{job.run.label}: eval N={self.samples}"

    # --- main loop --------------------------------------------------------------------------

    def execute(self, plans: dict[Run, Plan]) -> None:
        self.done = sum(plan.action == "done" for plan in plans.values())
        self.pending = [(run, plan) for run, plan in plans.items() if plan.action != "done"]
        self.pending = [(run, plan) for run, plan in self.pending if plan.action != "conflict"]
        if not self.pending:
            self._note(f"nothing to run ({self._counts()} done)")
            return
        self.total_work = sum(
            self._weight(self.steps if plan.action == "eval" else plan.step or 0)
            for _, plan in self.pending
        )
        self._note(
            f"{len(self.pending)} runs to do, {self.jobs} at a time ({self._counts()} already done)"
        )
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            disable=not self.show_progress,
            refresh_per_second=2,
        )
        try:
            with progress:
                overall = progress.add_task("grid", total=len(self.runs), info="")
                while self.pending or self.running:
                    while not self.stopping and self.pending and len(self.running) < self.jobs:
                        run, plan = self.pending.pop(0)
                        job = self._start(run, plan)
                        self._note(f"start {job.phase} {run.label} ({plan.action})")
                        self.running.append(job)
                    self._tick(progress)
                    if self.stopping and not self.running:
                        break
                    self._update(progress, overall)
                    time.sleep(0.5)
        except KeyboardInterrupt:
            self._stop(progress)
        finally:
            signal.signal(signal.SIGTERM, previous_term)
        if self.stopping:
            self._note(f"stopped ({self._counts()} done); run the same command again to resume")

    def _tick(self, progress: Progress) -> None:
        for job in list(self.running):
            if job.phase == "train":
                self._poll_steps(job)
            if job.process.poll() is None:
                continue
            if job.phase == "train":
                self._poll_steps(job)
            self.running.remove(job)
            if job.task is not None:
                progress.remove_task(job.task)
            follow = self._finish(job)
            if follow is not None:
                self.running.append(follow)

    def _update(self, progress: Progress, overall: TaskID) -> None:
        elapsed = _hms(time.monotonic() - self.started)
        fraction = sum(self._fraction(job) for job in self.running)
        progress.update(
            overall,
            completed=self.done + fraction,
            info=f"{self._counts()}  elapsed {elapsed}  {self._eta()}",
        )
        for job in self.running:
            if job.task is None:
                job.task = progress.add_task("", total=1.0, info="")
            share = job.step / self.steps if job.phase == "train" else 1.0
            progress.update(job.task, description=f"  {self._describe(job)}", completed=share)

    def _stop(self, progress: Progress) -> None:
        """First Ctrl-C: forward one SIGINT to each child, wait for them, record their time."""
        self.stopping = True
        self._note("interrupt: stopping the children (training checkpoints first)...")
        for job in self.running:
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 300
        while self.running and time.monotonic() < deadline:
            try:
                self._tick(progress)
                time.sleep(0.5)
            except KeyboardInterrupt:
                break
        for job in self.running:  # second Ctrl-C or a child that did not stop in time
            job.process.kill()
            job.process.wait()
            job.log.close()
        self.running.clear()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _hms(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# ------------------------------------------------------------------------------------ report


def collect_rows(runs: Iterable[Run], out: Path) -> tuple[list[dict[str, Any]], list[Run]]:
    """One row per run with metrics (and the run's per-length log p_term); missing runs."""
    rows, missing = [], []
    for run in runs:
        run_dir = out / run.name
        metrics = _read_json(run_dir / METRICS)
        if metrics is None:
            missing.append(run)
            continue
        record = read_record(run_dir)
        seconds = [record.get("train_seconds"), record.get("eval_seconds")]
        wall = sum(seconds) if all(isinstance(s, int | float) for s in seconds) else None
        row: dict[str, Any] = {
            "replay": run.replay,
            "objective": run.objective,
            "seed": run.seed,
            "steps": metrics.get("eval", {}).get("step"),
        }
        for key in CSV_COLUMNS[4:-1]:
            row[key] = metrics.get(key)
        row["wall_seconds"] = None if wall is None else round(wall, 1)
        row["n_samples"] = metrics.get("n_samples")
        row["log_pterm_by_length"] = metrics.get("log_pterm_by_length", {})
        row["command"] = record.get("command")
        row["setup"] = (
            record.get("threads"),
            record.get("jobs"),
            tuple(record.get("extra_train_args") or ()),
        )
        rows.append(row)
    return rows, missing


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow(["" if row[key] is None else row[key] for key in CSV_COLUMNS])
    return path


@dataclass(frozen=True)
class CellStats:
    replay: str
    objective: str
    n: int
    stats: dict[str, tuple[float, float]]  # key -> (mean, half width; nan with one seed)


def cell_stats(rows: Sequence[dict[str, Any]]) -> list[CellStats]:
    """Mean and 95% t-interval half width over seeds of every table metric, per cell."""
    result = []
    for replay, objective in grid_cells():
        group = [r for r in rows if (r["replay"], r["objective"]) == (replay, objective)]
        if not group:
            continue
        stats: dict[str, tuple[float, float]] = {}
        keys = [key for key, _, _ in TABLE_METRICS]
        for key in keys:
            values = [float(r[key]) for r in group if isinstance(r.get(key), int | float)]
            if values:
                interval = mean_ci(values)
                stats[key] = (interval.mean, interval.half_width)
        for length in TERMINATION_LENGTHS:
            values = [
                float(r["log_pterm_by_length"][str(length)])
                for r in group
                if str(length) in r["log_pterm_by_length"]
            ]
            if values:
                interval = mean_ci(values)
                stats[f"pterm{length}"] = (interval.mean, interval.half_width)
        result.append(CellStats(replay, objective, len(group), stats))
    return result


def _fmt(stat: tuple[float, float] | None, decimals: int) -> str:
    if stat is None:
        return "–"
    mean, half = stat
    if math.isnan(half):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {half:.{decimals}f}"


def _table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(":--" if i < 2 else "--:" for i in range(len(header))) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in body)
    return lines


def _grouped(cells: Sequence[CellStats]) -> Iterable[tuple[str, CellStats]]:
    """(replay label shown only on the first row of its group, cell) pairs."""
    previous = None
    for cell in cells:
        shown = REPLAY_LABELS[cell.replay] if cell.replay != previous else ""
        previous = cell.replay
        yield shown, cell


def markdown_report(
    rows: Sequence[dict[str, Any]],
    cells: Sequence[CellStats],
    missing: Sequence[Run],
    *,
    command: str,
    machine: str,
    extra: Sequence[str],
    threads: int,
    jobs: int,
) -> str:
    steps = sorted({r["steps"] for r in rows if r["steps"] is not None})
    samples = sorted({r["n_samples"] for r in rows if r["n_samples"] is not None})
    seeds = sorted({r["seed"] for r in rows})
    producers = sorted({r["command"] for r in rows if r.get("command")})
    walls = [r["wall_seconds"] for r in rows if r["wall_seconds"] is not None]
    setups = {r["setup"] for r in rows if r["setup"][0] is not None}
    mixed = len(setups) > 1
    if len(setups) == 1:  # the runs' own settings win over this invocation's flags
        threads, found_jobs, extra = setups.pop()
        jobs = found_jobs or jobs
    lines = [
        "# Expr24: replay x objective grid",
        "",
        "Reproduction of the paper's Expr24 study (tables \"Expr24 results under different replay",
        'schemes" and "Termination/length calibration diagnostic") with this implementation and',
        "the default embedded `tiny` model on CPU. Generated by `benchmarks/expr24_grid.py`.",
        "",
        f"- Command: `{command}`",
    ]
    if producers and producers != [command]:
        lines.append("- Runs produced by: " + ", ".join(f"`{p}`" for p in producers))
    lines += [
        f"- Machine: {machine}",
        f"- Date: {datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Steps: {', '.join(map(str, steps)) or '–'} optimizer steps per run"
        + (" (WARNING: runs with different steps are mixed)" if len(steps) > 1 else ""),
        f"- Samples: N = {', '.join(map(str, samples)) or '–'} per run (temperature 1, eval seed ="
        " run seed)",
        f"- Seeds: {', '.join(map(str, seeds)) or '–'}; {len(rows)} runs with metrics"
        + (f", {len(missing)} missing: {', '.join(r.name for r in missing)}" if missing else ""),
        f"- Training: paper's Expr24 hyperparameters (config defaults), `--threads {threads}`, "
        f"{jobs} runs at a time"
        + (f"; extra train args `{shlex.join(extra)}`" if extra else "")
        + ("; WARNING: runs used different settings" if mixed else ""),
    ]
    if walls:
        lines.append(
            f"- Wall time per run (train + eval): mean {np.mean(walls):.0f} s, "
            f"total {sum(walls) / 3600:.2f} h of run time"
        )
    lines += [
        "",
        "Raw per-run values: [`expr24_grid.csv`](expr24_grid.csv).",
        "",
        "## Results (mean ± 95% CI over seeds)",
        "",
        "t-interval mean ± t_{S-1,0.975} sd / sqrt(S) over the seeds of a cell (no ± with one",
        "seed). Unique and CovCount count distinct correct expressions; NormCov = CovCount /",
        "min(N, |Y*|); KL and JS compare position-wise token marginals of the correct samples",
        "with the enumerated solution set; log p_term is the raw stop log-probability at the",
        "sampled stop step (all samples); Len is the mean length of correct samples.",
        "",
    ]
    header = ["Replay", "Objective", "n", *[label for _, label, _ in TABLE_METRICS]]
    body = [
        [
            shown,
            OBJECTIVE_LABELS[cell.objective],
            str(cell.n),
            *[_fmt(cell.stats.get(key), dec) for key, _, dec in TABLE_METRICS],
        ]
        for shown, cell in _grouped(cells)
    ]
    lines += _table(header, body)
    lines += [
        "",
        "## Termination diagnostic: log p_term by length",
        "",
        "Mean over samples of the raw model log-probability of stop at the sampled stop step,",
        "for samples of each length (all samples, correct or not); mean ± 95% CI over seeds. More",
        "negative values mean suppressed termination (the paper's termination drift).",
        "",
    ]
    header = ["Replay", "Objective", "n", "log p_term", *[f"L = {n}" for n in TERMINATION_LENGTHS]]
    body = [
        [
            shown,
            OBJECTIVE_LABELS[cell.objective],
            str(cell.n),
            _fmt(cell.stats.get("log_pterm"), 3),
            *[_fmt(cell.stats.get(f"pterm{n}"), 3) for n in TERMINATION_LENGTHS],
        ]
        for shown, cell in _grouped(cells)
    ]
    lines += _table(header, body)
    lines += [
        "",
        "## Plots",
        "",
        f"![CovCount per cell]({COVERAGE_PNG})",
        "",
        f"![log p_term per cell]({PTERM_PNG})",
        "",
        "## Comparison with the paper",
        "",
        "_Placeholder: to be written from the measured numbers above (which of the paper's",
        "orderings hold here, which do not, and the most likely reason)._",
        "",
    ]
    return "\n".join(lines)


def _cell_label(cell: CellStats) -> str:
    return f"{REPLAY_LABELS[cell.replay]}\n{OBJECTIVE_LABELS[cell.objective]}"


def plot_cells(
    cells: Sequence[CellStats],
    rows: Sequence[dict[str, Any]],
    key: str,
    ylabel: str,
    title: str,
    path: Path,
    linthresh: float | None = None,
) -> Path:
    """Bar per cell (mean over seeds, 95% CI error bars), seeds as dots, colour by replay."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colours = dict(zip(REPLAYS, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    figure = Figure(figsize=(max(6.0, 0.75 * len(cells) + 1.5), 4.5), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(cells))
    for x, cell in zip(positions, cells, strict=True):
        mean, half = cell.stats.get(key, (math.nan, math.nan))
        axes.bar(
            x,
            mean,
            width=0.7,
            color=colours[cell.replay],
            alpha=0.75,
            yerr=None if math.isnan(half) else half,
            capsize=3,
        )
        values = [
            float(r[key])
            for r in rows
            if (r["replay"], r["objective"]) == (cell.replay, cell.objective)
            and isinstance(r.get(key), int | float)
        ]
        axes.scatter([x] * len(values), values, s=10, color="black", zorder=3)
    axes.set_xticks(positions, [_cell_label(c) for c in cells], fontsize=7)
    largest = max((abs(c.stats[key][0]) for c in cells if key in c.stats), default=0.0)
    if linthresh is not None and largest > 20 * linthresh:  # spans orders of magnitude
        from matplotlib.ticker import ScalarFormatter

        axes.set_yscale("symlog", linthresh=linthresh)
        axes.yaxis.set_major_formatter(ScalarFormatter())
        ylabel += " (symlog)"
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.set_xlabel("bars: mean over seeds; whiskers: 95% CI; dots: seeds", fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=110)
    return path


def write_report(
    runs: Sequence[Run],
    out: Path,
    report_dir: Path,
    *,
    command: str,
    machine: str,
    extra: Sequence[str],
    threads: int,
    jobs: int,
) -> tuple[int, list[Run]]:
    """Write csv, md and plots for ``runs``; return (rows written, runs without metrics)."""
    rows, missing = collect_rows(runs, out)
    report_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, report_dir / CSV_NAME)
    cells = cell_stats(rows)
    text = markdown_report(
        rows,
        cells,
        missing,
        command=command,
        machine=machine,
        extra=extra,
        threads=threads,
        jobs=jobs,
    )
    (report_dir / MD_NAME).write_text(text, encoding="utf-8")
    plot_cells(
        cells,
        rows,
        "cov_count",
        "CovCount: distinct correct in Y*",
        "Expr24 coverage per cell",
        report_dir / COVERAGE_PNG,
        linthresh=10.0,
    )
    plot_cells(
        cells,
        rows,
        "log_pterm",
        "log p_term at the sampled stop",
        "Expr24 termination log-probability per cell",
        report_dir / PTERM_PNG,
        linthresh=1.0,
    )
    return len(rows), missing


# --------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Expr24 replay x objective grid: train, evaluate, report (mean ± 95% CI).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps per run")
    parser.add_argument("--samples", type=int, default=6400, help="evaluation samples N per run")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per child")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of run dirs")
    parser.add_argument(
        "--report-dir", type=Path, default=DEFAULT_REPORT_DIR, help="folder for csv, md and PNGs"
    )
    parser.add_argument(
        "--cells",
        default=None,
        help="only these cells: objective:replay items, comma-separated, '*' matches any "
        "(e.g. tb:rp,raptb:subm or '*:oracle'); default: the whole grid",
    )
    parser.add_argument(
        "--extra-train-args",
        default="",
        help="more 'raptb train' flags for every run, one shell-quoted string; write it as "
        "--extra-train-args='--batch-size 8 --grad-accum 1'",
    )
    parser.add_argument(
        "--machine", default="2-core CPU, 24 GiB", help="machine description for the report"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="regenerate csv/md/plots from existing runs"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what each run needs, start nothing"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of progress bars"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "benchmarks/expr24_grid.py", *argv])
    console = Console(stderr=True)
    try:
        cells = parse_cells(args.cells)
        seeds = parse_seeds(args.seeds)
        extra = shlex.split(args.extra_train_args)
    except ValueError as exc:
        parser.error(str(exc))
    for name in ("steps", "samples", "jobs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    runs = grid_runs(cells, seeds)
    out = args.out

    status = 0
    if not args.report_only:
        plans = {run: plan_run(run, out / run.name, args.steps, args.samples) for run in runs}
        conflicts = {run: plan for run, plan in plans.items() if plan.action == "conflict"}
        if args.dry_run:
            for run, plan in plans.items():
                at = f" (checkpoint {plan.step})" if plan.step is not None else ""
                console.print(f"{run.name:28s} {plan.action}{at} {plan.reason}", highlight=False)
            return 0
        for run, plan in conflicts.items():
            console.print(f"[red]conflict[/] {out / run.name}: {plan.reason}", highlight=False)
        if conflicts:
            return 2
        grid = Grid(
            runs=runs,
            out=out,
            steps=args.steps,
            samples=args.samples,
            jobs=args.jobs,
            threads=args.threads,
            extra=extra,
            command=command,
            console=console,
            show_progress=not args.no_progress,
        )
        grid.execute(plans)
        for run, reason in grid.failed:
            console.print(f"[red]failed[/] {run.name}: {reason}", highlight=False)
        if grid.stopping:
            return 130
        status = 1 if grid.failed else 0

    count, missing = write_report(
        runs,
        out,
        args.report_dir,
        command=command,
        machine=args.machine,
        extra=extra,
        threads=args.threads,
        jobs=args.jobs,
    )
    console.print(
        f"report: {count} runs ({len(missing)} missing) -> "
        f"{args.report_dir / CSV_NAME}, {args.report_dir / MD_NAME}, "
        f"{args.report_dir / COVERAGE_PNG}, {args.report_dir / PTERM_PNG}",
        highlight=False,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
