"""What the second core gives a pretrained model's step, over every run of the threads' comparison.

Usage (from the repository root):

    python benchmarks/thread_gain.py --commit COMMIT OUT.md [OUT.md ...]

Each OUT.md is what ``benchmarks/pretrained_step.py --against-threads 2 ... --out OUT.md`` wrote:
one run, a table a task of each stage's median seconds on one thread and on two. Its rows (run,
commit, machine, task, stage, one_thread_s, two_threads_s) are appended to
``benchmarks/results/thread_gain/runs.csv``, COMMIT being the commit whose step the run timed; a
run already there (the same start time and task) is refused. ``benchmarks/pages.py`` writes the
table of ``docs/benchmarks.md`` from that file (``thread_gain_table``): for each task the ratio of
one thread's seconds over two threads' of the step and of its main stages, a value a run, as the
mean with its 95% Student-t interval over runs, the runs' range, and the 95% prediction interval
of one more run.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script's siblings, from any caller
from result_files import RESULTS, Spread, read_csv

RUNS = RESULTS / "thread_gain" / "runs.csv"
FIELDS = ("run", "commit", "machine", "task", "stage", "one_thread_s", "two_threads_s")
STEP = "wall"
"""The stage row holding the whole step's wall seconds."""
SHOWN = ("rollout: model + sampling", "reference pass", "rescoring forward", "loss + backward")
"""The stages the table shows beside the step (each a sixth or more of it)."""
TASK_NAMES = {"smiles": "SMILES", "expr24": "Expr24"}

_COMMAND = re.compile(r"; (\d{4}-\d\d-\d\d \d\d:\d\d) UTC; CPU (.+?), (\d+) cores;")
_TABLE = re.compile(r"^\| (\w+): stage \| 1 thread wall s \| 2 threads wall s \| ratio \|")
_ROW = re.compile(r"^\| ([^|]+?) \| ([0-9.]+) \| ([0-9.]+) \| [0-9.]+x \|")


def parse(text: str, commit: str) -> list[dict[str, str]]:
    """The rows of one run of ``pretrained_step.py --threads 1 --against-threads 2``'s output."""
    command = _COMMAND.search(text)
    if command is None:
        raise ValueError("no 'Command: ...; DATE UTC; CPU ..., N cores;' line: not that output")
    run, cpu, cores = command.groups()
    machine = f"{cores}-core {cpu}"
    rows: list[dict[str, str]] = []
    task = None
    for line in text.splitlines():
        table = _TABLE.match(line)
        if table is not None:
            task = table.group(1)
            continue
        row = _ROW.match(line)
        if task is not None and row is not None and not row.group(1).startswith("step TFLOP"):
            stage, one, two = row.groups()
            values = (run, commit, machine, task, stage, one, two)
            rows.append(dict(zip(FIELDS, values, strict=True)))
        elif not line.startswith("|"):
            task = None  # a table ends at its first line that is not a row
    if not any(row["stage"] == STEP for row in rows):
        raise ValueError("no table of one thread against two threads with its 'wall' row")
    return rows


def append(rows: list[dict[str, str]], path: Path = RUNS) -> None:
    """``rows`` added to ``path`` (written with its header if new); a run and task already
    there is refused."""
    old = read_csv(path) if path.exists() else []
    there = {(row["run"], row["task"]) for row in old}
    again = sorted({(row["run"], row["task"]) for row in rows} & there)
    if again:
        raise ValueError(f"already in {path}: {again}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS, lineterminator="\n")
        if not old:
            writer.writeheader()
        writer.writerows(rows)


def thread_gain_table(path: Path = RUNS) -> str:
    """For each task, the step's and its main stages' ratios over the runs (module docstring)."""
    rows = read_csv(path)
    lines = [
        "| task: stage | runs | one thread, s | two threads, s | two threads' gain: mean ± 95% "
        "CI | range of runs | one more run (95%) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for task in dict.fromkeys(row["task"] for row in rows):
        for stage in (STEP, *SHOWN):
            mine = [row for row in rows if row["task"] == task and row["stage"] == stage]
            if not mine:
                continue
            one = [float(row["one_thread_s"]) for row in mine]
            two = [float(row["two_threads_s"]) for row in mine]
            gains = [a / b for a, b in zip(one, two, strict=True)]  # a value a run
            gain = Spread(gains)
            name = "the step" if stage == STEP else stage
            lines.append(
                f"| {TASK_NAMES.get(task, task)}: {name} | {gain.n} | {fmean(one):.2f} "
                f"| {fmean(two):.2f} "
                f"| {gain.cell(2)}x | {min(gains):.2f}-{max(gains):.2f}x "
                f"| {gain.run_range(2)}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outputs", nargs="+", type=Path)
    parser.add_argument("--commit", required=True, help="the commit whose step the runs timed")
    args = parser.parse_args()
    rows = [row for out in args.outputs for row in parse(out.read_text(), args.commit)]
    append(rows)
    print(f"{len(rows)} rows added to {RUNS}")


if __name__ == "__main__":
    main()
