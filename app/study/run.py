"""Run a study's runs, ``workers`` at a time, each as ``raptb train`` then ``raptb eval`` children.

Children keep a crash to their own run: a failed run is recorded with its reason and log, and
the others go on. Each child gets ``max(1, cores // workers)`` torch threads, or its run's own
``threads`` when that is fewer (the embedded tiny model's 1: ``run_threads``). The
children's output goes to ``study-train.log`` / ``study-eval.log`` in the run directory, and
``study.json`` records the wall time of training (summed over resumptions) and evaluation.

Ctrl-C reaches the children too (same process group): training checkpoints and exits, no new
run starts, and the next invocation picks up where this one stopped. A study killed otherwise
(kill -9, a lost session) takes its children with it: each gets SIGTERM when the study process
ends (a parent-death signal), checkpoints and exits.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from raptb.app.parent_death import die_with
from raptb.app.run_dir.run_config import save_config
from raptb.app.run_dir.run_lock import lock_holder
from raptb.app.study.plan import PlannedRun
from raptb.app.study.state import (
    EXACT,
    METRICS,
    PLANNED_CONFIG,
    RunState,
    latest_step,
    read_json,
)

RECORD = "study.json"
# the ``raptb`` console script run with this interpreter; SIGINT's default handler is restored
# because a study started in the background (``... &``) passes SIGINT on as ignored
STUDY_PID_ENV = "RAPTB_STUDY_PID"
RAPTB = (
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from raptb.app.study.run import die_with_the_study; die_with_the_study(); "
    "sys.argv[0] = 'raptb'; from raptb.app.entry import main; main()",
)


def die_with_the_study() -> None:
    """In a study's child: SIGTERM when the study process ends in any way (kill -9 included), so
    a trainer checkpoints and exits instead of running on unwatched (Linux; elsewhere a no-op).
    A study already gone before this point ends the child at once."""
    die_with(int(os.environ.get(STUDY_PID_ENV, "0")))


@dataclass(frozen=True)
class RunTask:
    """A planned run, its directory, what it needs, and its evaluation settings."""

    run: PlannedRun
    run_dir: Path
    state: RunState
    samples: int
    eval_seed: int
    exact: bool = False
    """Also run ``raptb eval --exact`` after the sampled evaluation."""


@dataclass(frozen=True)
class Failure:
    name: str
    reason: str


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def threads_per_run(workers: int, cores: int | None = None) -> int:
    return max(1, (cores or available_cores()) // workers)


def run_threads(configured: int | None, share: int) -> int:
    """Torch threads for a run whose config sets ``configured`` (None: torch's choice), when the
    study gives each run ``share`` cores: the share, or fewer where the run asks for fewer (a
    second thread does not speed the embedded model's step up, and slows it down many times when
    its busy-waiting threads meet other jobs on the cores: benchmarks/step_speed.md)."""
    return share if configured is None else max(1, min(configured, share))


def train_args(task: RunTask, threads: int) -> list[str]:
    """``raptb train`` arguments: continue from the checkpoint, or start from the planned config."""
    if task.state.action == "resume":
        head = ["train", "--resume", "--out", str(task.run_dir)]
    else:
        head = ["train", "--config", str(task.run_dir / PLANNED_CONFIG), "--out", str(task.run_dir)]
    return [*head, "--threads", str(threads), "--no-progress"]


def eval_args(task: RunTask) -> list[str]:
    return [
        "eval",
        str(task.run_dir),
        "--samples",
        str(task.samples),
        "--seed",
        str(task.eval_seed),
        "--json",
    ]


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env[STUDY_PID_ENV] = str(os.getpid())
    return env


def _write_record(run_dir: Path, **seconds: float) -> None:
    record = read_json(run_dir / RECORD) or {}
    record.update(seconds)
    tmp = run_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / RECORD)


class StudyRunner:
    """Executes ``RunTask``s on a pool of ``workers`` threads, each driving child processes."""

    def __init__(self, workers: int, console: Console, *, progress: bool = True) -> None:
        self.workers = workers
        self.threads = threads_per_run(workers)
        self.console = console
        self.progress = progress
        self.stopping = threading.Event()
        self.failures: list[Failure] = []
        self._lock = threading.Lock()
        self._phase: dict[str, str] = {}

    def threads_of(self, task: RunTask) -> int:
        """Torch threads for ``task``'s children (``run_threads``)."""
        return run_threads(task.run.config.threads, self.threads)

    def _child(self, task: RunTask, phase: str, args: list[str]) -> tuple[int, float]:
        """Run one child to its end; its exit code and wall seconds."""
        with self._lock:
            self._phase[task.run.name] = phase
        start = time.monotonic()
        with (task.run_dir / f"study-{phase}.log").open("a", encoding="utf-8") as log:
            log.write(f"\n# raptb {shlex.join(args)}\n")
            log.flush()
            code = subprocess.call(
                [*RAPTB, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_child_env(self.threads_of(task)),
            )
        return code, time.monotonic() - start

    def execute_one(self, task: RunTask) -> Failure | None:
        """Train (unless already trained) and evaluate one run; a Failure or None."""
        run_dir, action = task.run_dir, task.state.action
        if action in ("train", "restart"):
            holder = lock_holder(run_dir)
            if holder is not None:  # started since the plan was made
                return Failure(task.run.name, f"{run_dir} is being written by {holder}")
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            save_config(task.run.config, run_dir / PLANNED_CONFIG)
            _write_record(run_dir, train_seconds=0.0)
        if action in ("train", "restart", "resume"):
            code, seconds = self._child(task, "train", train_args(task, self.threads_of(task)))
            previous = (read_json(run_dir / RECORD) or {}).get("train_seconds", 0.0)
            _write_record(run_dir, train_seconds=previous + seconds)
            log = run_dir / "study-train.log"
            if self.stopping.is_set():
                return None
            if code != 0:
                return Failure(task.run.name, f"train exited with {code}; see {log}")
            step = latest_step(run_dir)
            if step != task.run.config.steps:
                return Failure(task.run.name, f"training stopped at step {step}; see {log}")
        code, seconds = self._child(task, "eval", eval_args(task))
        if code == 0 and task.exact and not self.stopping.is_set():
            code, more = self._child(task, "eval", [*eval_args(task)[:2], "--exact", "--json"])
            seconds += more
        _write_record(run_dir, eval_seconds=seconds)
        if self.stopping.is_set():
            return None
        if (
            code != 0
            or read_json(run_dir / METRICS) is None
            or (task.exact and read_json(run_dir / EXACT) is None)
        ):
            log = run_dir / "study-eval.log"
            return Failure(task.run.name, f"eval exited with {code}; see {log}")
        return None

    def _steps_done(self, task: RunTask) -> float:
        """Fraction of a running run's work done: training steps logged, eval counted as 10%."""
        if self._phase.get(task.run.name) == "eval":
            return 0.9
        try:
            with (task.run_dir / "metrics.jsonl").open("rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 16), b""))
        except OSError:
            return 0.0
        return 0.9 * min(1.0, lines / task.run.config.steps)

    def run(self, tasks: Sequence[RunTask], on_done: Callable[[RunTask, Failure | None], None]):
        """Execute ``tasks``; ``on_done`` is called (in this thread) as each one ends."""
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[running]}"),
            console=self.console,
            disable=not self.progress,
            refresh_per_second=2,
        )
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="study")
        futures: dict[Future[Failure | None], RunTask] = {
            pool.submit(self._guarded, task): task for task in tasks
        }
        finished = 0
        try:
            with bar:
                overall = bar.add_task("runs", total=len(tasks), running="")
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        finished += 1
                        failure = future.result()
                        if failure is not None:
                            self.failures.append(failure)
                        on_done(futures[future], failure)
                    running = [t for f, t in futures.items() if f.running()]
                    partial = sum(self._steps_done(t) for t in running)
                    names = ", ".join(t.run.name for t in running)
                    bar.update(overall, completed=finished + partial, running=names)
        except KeyboardInterrupt:
            self.stopping.set()
            self.console.print("interrupt: letting the children checkpoint, then stopping...")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _guarded(self, task: RunTask) -> Failure | None:
        if self.stopping.is_set():
            return None
        try:
            return self.execute_one(task)
        except OSError as exc:  # e.g. a full disk while writing the run's files
            return Failure(task.run.name, f"{type(exc).__name__}: {exc}")
