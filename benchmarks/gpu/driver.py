"""Run one GPU plan within a deadline: each stage in its own process, results after every stage.

Usage (from the repository root; on a GPU slot through ``run_plan.sh``):

    python benchmarks/gpu/driver.py --plan first --deadline 540 --out DIR [--dry-run] \
        [--stages decode_1b,headline_pair] [--work DIR]

Stages run in the order of ``plans.PLANS[plan]``. Each gets ``min(stage.limit_s, time left -
RESERVE_S)`` seconds (``--dry-run``: tiny shapes on the CPU, at least ``DRY_LIMIT_S``) and is
killed (its process group) when it runs over; a stage that fails or times out records its error
and the next one runs; one whose ``min_s`` no longer fits is recorded as skipped. After every
stage the driver rewrites, in ``--out`` (at most 8 files):

- ``plan_PLAN.json``: the plan, its date and commit and, per stage, ``status`` (ok, failed,
  timed_out, skipped), ``seconds``, ``error`` and the stage's ``result`` (a stage whose result
  lists ``errors``, e.g. a training run that failed, is failed with its result kept);
- the record files the stages add to (``rollout_speed.json``, ``scales.json``, ...: lists of
  records, one list per file, appended to);
- ``logs.tar.gz``: every stage's output (stdout and stderr).

The driver imports no torch; the stages' processes do (``stage.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from plans import PLANS, Stage

HERE = Path(__file__).resolve().parent
RESERVE_S = 10.0
"""Seconds kept back from the deadline for writing the results."""
MAX_FILES = 8
DRY_LIMIT_S = 180.0
"""A dry run's least limit per stage (a shared CPU at tiny shapes is slower than a GPU)."""
ERROR_TAIL = 2000


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the stage's process group (its children too), SIGKILL 10 s later."""
    for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stage(stage: Stage, timeout: float, work: Path, dry_run: bool) -> dict[str, Any]:
    """One stage in its own process (``stage.py``); its outcome as the plan JSON records it."""
    result_file, log_file = work / f"{stage.name}.json", work / "logs" / f"{stage.name}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(HERE / "stage.py"), stage.module, stage.name]
    command += ["--result", str(result_file), "--work", str(work / stage.name)]
    command += ["--budget", f"{timeout:.0f}"] + (["--dry-run"] if dry_run else [])
    start = time.monotonic()
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            code = None
    outcome: dict[str, Any] = {"seconds": round(time.monotonic() - start, 1)}
    tail = log_file.read_text(errors="replace")[-ERROR_TAIL:]
    if code is None:
        outcome |= {"status": "timed_out", "error": f"killed after {timeout:.0f} s\n{tail}"}
    elif code != 0 or not result_file.is_file():
        outcome |= {"status": "failed", "error": f"exit code {code}\n{tail}"}
    else:
        result = json.loads(result_file.read_text())
        failures = result.get("errors") or []  # parts of the stage that failed (its runs)
        outcome |= {"status": "failed" if failures else "ok", "error": "; ".join(failures) or None}
        outcome["result"] = result
    return outcome


def add_records(out: Path, files: dict[str, list[dict[str, Any]]]) -> None:
    """Append each stage record list to its file in ``out`` (a JSON list, created if absent)."""
    for name, records in files.items():
        path = out / name
        previous = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps(previous + records, indent=2) + "\n")


def write_results(out: Path, work: Path, summary: dict[str, Any]) -> None:
    (out / f"plan_{summary['plan']}.json").write_text(json.dumps(summary, indent=2) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as archive:
        archive.add(work / "logs", arcname="logs")
    files = [p for p in out.rglob("*") if p.is_file()]
    if len(files) > MAX_FILES:
        raise SystemExit(f"{out} holds {len(files)} files, more than {MAX_FILES} come back")


def run_plan(
    plan: str, deadline: float, out: Path, work: Path, dry_run: bool, only: list[str] | None = None
) -> dict[str, Any]:
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "plan": plan,
        "dry_run": dry_run,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": os.environ.get("RAPTB_COMMIT"),
        "deadline_s": deadline,
        "stages": {},
    }
    for stage in PLANS[plan]:
        if only and stage.name not in only:
            continue
        left = deadline - (time.monotonic() - start) - RESERVE_S
        if left < stage.min_s:
            outcome = {"status": "skipped", "seconds": 0.0, "error": f"{left:.0f} s left"}
        else:
            limit = max(stage.limit_s, DRY_LIMIT_S) if dry_run else stage.limit_s
            outcome = run_stage(stage, min(limit, left), work, dry_run)
        if outcome.get("result"):
            add_records(out, outcome["result"].pop("files", {}))
        summary["stages"][stage.name] = outcome
        write_results(out, work, summary)
        print(f"{stage.name}: {outcome['status']} ({outcome['seconds']} s)", flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=list(PLANS), required=True)
    parser.add_argument("--deadline", type=float, required=True, help="seconds for the plan")
    parser.add_argument("--out", type=Path, required=True, help="where the results go")
    parser.add_argument("--work", type=Path, default=None, help="scratch (default: a temp dir)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, on the CPU")
    parser.add_argument("--stages", default=None, help="only these stages (comma-separated)")
    args = parser.parse_args()
    only = args.stages.split(",") if args.stages else None
    unknown = set(only or ()) - {stage.name for stage in PLANS[args.plan]}
    if unknown:
        parser.error(f"--stages: not in plan {args.plan}: {', '.join(sorted(unknown))}")
    work = args.work or Path(tempfile.mkdtemp(prefix="raptb-gpu-"))
    summary = run_plan(args.plan, args.deadline, args.out, work, args.dry_run, only)
    failed = [name for name, s in summary["stages"].items() if s["status"] != "ok"]
    print(f"{args.plan}: {len(summary['stages']) - len(failed)} stages ok; not ok: {failed}")


if __name__ == "__main__":
    main()
