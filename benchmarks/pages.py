"""The figures the README and the documentation quote, written from the committed results.

Usage (from the repository root):

    python benchmarks/pages.py           # rewrite every generated block of the pages
    python benchmarks/pages.py --check   # exit 1, naming each block that differs from its results

A page holds a generated block between ``<!-- gen:NAME -->`` and ``<!-- /gen:NAME -->``; BLOCKS
maps each NAME to the function that writes it from ``benchmarks/results/``, so a number quoted on a
page is the one its results file holds, and ``--check`` (run by ``.ci/run``) fails when somebody
edits one without the other. The sources:

- ``results/horizon_5000/runs.csv``: the main job (RapTB + SubM, 5,000 steps) and TB + RP at the
  same setting over five seeds (``studies/horizon_5000.toml``);
- ``results/horizon_10000_capacity/runs.csv``: a buffer of 1000 and 10,000 steps, five seeds;
- ``results/fresh_clone/main_job.csv``: the README's first command from a fresh clone and a new venv
  (``benchmarks/fresh_clone.sh main-job`` appends a row);
- ``results/fresh_clone/suite.csv``: the README's test command the same way
  (``benchmarks/fresh_clone.sh suite``);
- ``results/pretrained_smiles/runs.csv``: SmolLM2-135M + LoRA on SMILES, RapTB + SubM against
  TB + RP and GRPO (``studies/pretrained_smiles.toml``); its training curves are copied into
  ``docs/img/`` (FIGURES) so that the documentation site can show them;
- the field table of ``docs/rl-baselines.md`` (``benchmarks/field_table.py``'s FIELD): each
  method's runs on Expr24 from the studies it names (``diversity_zoo``,
  ``diversity_zoo_ips_flowrl`` and the studies that add seeds or steps to them), with the target
  (uniform over the solutions) for scale;
- ``results/thread_gain/runs.csv``: a pretrained model's step on two threads against one, every
  run of ``benchmarks/pretrained_step.py --against-threads 2`` added by
  ``benchmarks/thread_gain.py`` (over runs, not seeds).

Cells are means with their 95% Student-t interval over seeds; "one run" is the 95% prediction
interval of one more run, mean ± t_{S-1,0.975} sd sqrt(1 + 1/S).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script's siblings, from any caller
from field_table import field_table
from result_files import (
    ACC,
    DISTINCT,
    RESULTS,
    ROOT,
    Spread,
    by_row,
    read_csv,
    seconds_range,
    spread,
)
from thread_gain import thread_gain_table

MARKER = re.compile(r"<!-- gen:([a-z0-9-]+) -->\n(.*?)<!-- /gen:\1 -->", re.DOTALL)


def method_table(path: Path, header: str) -> str:
    """Mean ± CI of a study's two methods, with the one-run interval and the wall time."""
    lines = [
        f"| {header} | n | exact Acc | E[distinct correct] at 6,400 | uniformity "
        "| one run (95% prediction interval) | train + eval per run |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for method, runs in by_row(path).items():
        acc, distinct = spread(runs, ACC), spread(runs, DISTINCT)
        uniformity = spread(runs, "exact.uniformity")
        lines.append(
            f"| {method} | {acc.n} | {acc.cell(3)} | {distinct.cell(0)} | {uniformity.cell(3)} "
            f"| Acc {acc.run_range(2, high=1.0)}, {distinct.run_range(0)} distinct "
            f"| {seconds_range(runs)} |"
        )
    return "\n".join(lines) + "\n"


def main_job() -> tuple[Spread, Spread]:
    runs = by_row(RESULTS / "horizon_5000" / "runs.csv")["RapTB + SubM"]
    return spread(runs, ACC), spread(runs, DISTINCT)


def latest(path: Path) -> dict[str, str]:
    return read_csv(path)[-1]


def readme_main_job() -> str:
    """The README's first screen: how long the command takes and what it prints."""
    acc, distinct = main_job()
    fresh = latest(RESULTS / "fresh_clone" / "main_job.csv")
    minutes = round(float(fresh["total_seconds"]) / 60)
    return (
        f"It takes about {minutes} minutes on 2 cores, install included, and ends by printing the "
        f"paper's Expr24 metrics: expect an exact accuracy of {acc.mean:.2f} with "
        f"{distinct.mean:.0f} distinct correct expressions expected in 6,400 samples.\n"
    )


def readme_expect() -> str:
    """The README's interval for one run, and where the figures come from."""
    acc, distinct = main_job()
    fresh = latest(RESULTS / "fresh_clone" / "main_job.csv")
    return (
        f"Over five seeds the main job gives exact Acc {acc.cell(2)} with {distinct.cell(0)} "
        f"expected distinct correct expressions; one run lands within Acc "
        f"{acc.run_range(2, high=1.0)} with {distinct.run_range(0)} (the latest from a fresh "
        f"clone, {fresh['date']} at {fresh['commit']}: {float(fresh['exact_acc']):.3f} with "
        f"{float(fresh['expected_distinct_6400']):.0f}).\n"
    )


def fresh_clone_runs() -> str:
    """Each fresh-clone run of the main job, and whether it lies in the five seeds' interval."""
    acc, distinct = main_job()
    lines = [
        "| date | commit | machine | install + train + eval | train | exact Acc | E[distinct] "
        "| inside the one-run interval |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for run in read_csv(RESULTS / "fresh_clone" / "main_job.csv"):
        total = int(run["total_seconds"])
        run_acc, run_distinct = float(run["exact_acc"]), float(run["expected_distinct_6400"])
        inside = abs(run_acc - acc.mean) <= acc.one_run and (
            abs(run_distinct - distinct.mean) <= distinct.one_run
        )
        lines.append(
            f"| {run['date']} | {run['commit']} | {run['machine']} | {total // 60} min "
            f"{total % 60} s | {run['train_seconds']} s | {run_acc:.3f} | {run_distinct:.0f} "
            f"| {'yes' if inside else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def suite_runs() -> str:
    lines = [
        "| date | commit | machine | passed | skipped | failed | whole command | pytest |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in read_csv(RESULTS / "fresh_clone" / "suite.csv"):
        lines.append(
            f"| {run['date']} | {run['commit']} | {run['machine']} | {int(run['passed']):,} "
            f"| {run['skipped']} | {run['failed']} | {run['total_minutes']} min "
            f"| {run['pytest_minutes']} min |"
        )
    return "\n".join(lines) + "\n"


PRETRAINED = RESULTS / "pretrained_smiles"
PRETRAINED_BF16 = RESULTS / "pretrained_smiles_bf16"
PRETRAINED_METRICS = (
    ("acc", "Acc (valid)", 3),
    ("score", "Score", 3),
    ("fp_div", "FPDiv", 3),
    ("uniq_mol", "Uniq", 0),
)


def pretrained_table() -> str:
    """Mean ± CI over seeds of each method of the pretrained SMILES study."""
    names = " | ".join(name for _, name, _ in PRETRAINED_METRICS)
    lines = [
        f"| method | seeds | {names} | train + eval per run |",
        "|---|---:|" + "---:|" * len(PRETRAINED_METRICS) + "---|",
    ]
    studies = [PRETRAINED / "runs.csv", PRETRAINED_BF16 / "runs.csv"]
    for method, runs in (m for path in studies if path.exists() for m in by_row(path).items()):
        cells = " | ".join(spread(runs, key).cell(d) for key, _, d in PRETRAINED_METRICS)
        lines.append(f"| {method} | {len(runs)} | {cells} | {seconds_range(runs)} |")
    return "\n".join(lines) + "\n"


def readme_pretrained() -> str:
    """The README's sentence on the pretrained study, whichever way it fell."""
    methods = by_row(PRETRAINED / "runs.csv")
    ours = methods.pop("RapTB + SubM")

    def figures(runs: list[dict[str, str]]) -> str:
        acc, score = spread(runs, "acc").mean, spread(runs, "score").mean
        uniq, div = spread(runs, "uniq_mol").mean, spread(runs, "fp_div").mean
        return f"{acc:.2f} valid, Score {score:.2f}, {uniq:.0f} distinct, FPDiv {div:.2f}"

    others = "; ".join(f"{name} {figures(runs)}" for name, runs in methods.items())
    return (
        f"On a pretrained model, SmolLM2-135M with LoRA trained on a 2-core CPU (SMILES, "
        f"{int(ours[0]['steps'])} steps of 32 rows, {len(ours)} seeds, {ours[0]['n_samples']} "
        f"samples each), RapTB + SubM gives {figures(ours)}; {others} "
        "([the table](docs/benchmarks.md#the-papers-ordering-on-it)).\n"
    )


FIGURES = {
    "docs/img/pretrained_smiles_acc.png": PRETRAINED / "curve_acc_step.png",
    "docs/img/pretrained_smiles_unique.png": PRETRAINED / "curve_unique_correct_step.png",
}
"""Figures the documentation shows, copied from the results that drew them (the site cannot
reach files outside docs/)."""


BLOCKS: dict[str, Callable[[], str]] = {
    "readme-main-job": readme_main_job,
    "readme-expect": readme_expect,
    "main-job-table": lambda: method_table(
        RESULTS / "horizon_5000" / "runs.csv", "five seeds, 5,000 steps, buffer 200"
    ),
    "capacity-10000-table": lambda: method_table(
        RESULTS / "horizon_10000_capacity" / "runs.csv", "five seeds, 10,000 steps, buffer 1000"
    ),
    "fresh-clone-runs": fresh_clone_runs,
    "suite-runs": suite_runs,
    "pretrained-table": pretrained_table,
    "readme-pretrained": readme_pretrained,
    "field-table": field_table,
    "thread-gain-table": thread_gain_table,
}
PAGES = ("README.md", "docs/benchmarks.md", "docs/development.md", "docs/rl-baselines.md")


def render(text: str, page: str) -> str:
    """The page with every generated block written anew; an unknown block name raises."""

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in BLOCKS:
            raise KeyError(f"{page}: unknown generated block {name!r} (known: {sorted(BLOCKS)})")
        return f"<!-- gen:{name} -->\n{BLOCKS[name]()}<!-- /gen:{name} -->"

    return MARKER.sub(block, text)


def stale_blocks(text: str, page: str) -> list[str]:
    """The names of the page's blocks whose text differs from what their results give."""
    fresh = dict(MARKER.findall(render(text, page)))
    return [name for name, body in MARKER.findall(text) if fresh[name] != body]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail where a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        if args.check:
            stale += [f"{page}: {name}" for name in stale_blocks(text, page)]
        else:
            path.write_text(render(text, page))
    for copy, source in FIGURES.items():
        target = ROOT / copy
        if args.check:
            if not target.is_file() or target.read_bytes() != source.read_bytes():
                stale.append(f"{copy}: differs from {source.relative_to(ROOT)}")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    if stale:
        print("stale generated blocks (run `python benchmarks/pages.py`):", file=sys.stderr)
        print("\n".join(f"  {line}" for line in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
