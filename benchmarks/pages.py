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
- the field table of ``docs/rl-baselines.md`` (FIELD): each method's runs on Expr24 from the
  studies it names (``diversity_zoo``, ``diversity_zoo_ips_flowrl`` and the studies that add seeds
  or steps to them), with the target (uniform over the solutions) for scale.

Cells are means with their 95% Student-t interval over seeds; "one run" is the 95% prediction
interval of one more run, mean ± t_{S-1,0.975} sd sqrt(1 + 1/S).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ACC, DISTINCT = "exact.acc", "exact.expected_distinct.6400"
MARKER = re.compile(r"<!-- gen:([a-z0-9-]+) -->\n(.*?)<!-- /gen:\1 -->", re.DOTALL)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def by_row(path: Path) -> dict[str, list[dict[str, str]]]:
    """A study's ``runs.csv`` grouped by its ``row`` column (the method), in file order."""
    groups: dict[str, list[dict[str, str]]] = {}
    for run in read_csv(path):
        groups.setdefault(run["row"], []).append(run)
    return groups


class Spread:
    """Mean, 95% t half-width of the mean and of one more run, over the seeds' values."""

    def __init__(self, values: list[float]) -> None:
        self.n = len(values)
        self.mean = statistics.fmean(values)
        quantile = stats.t.ppf(0.975, self.n - 1) if self.n > 1 else math.nan
        sd = statistics.stdev(values) if self.n > 1 else math.nan
        self.half = quantile * sd / math.sqrt(self.n)
        self.one_run = quantile * sd * math.sqrt(1 + 1 / self.n)

    def cell(self, decimals: int) -> str:
        return f"{self.mean:,.{decimals}f} ± {self.half:,.{decimals}f}"

    def run_range(self, decimals: int, high: float = math.inf) -> str:
        low, top = self.mean - self.one_run, min(self.mean + self.one_run, high)
        return f"{max(low, 0):,.{decimals}f}-{top:,.{decimals}f}"


def spread(runs: list[dict[str, str]], key: str) -> Spread:
    return Spread([float(run[key]) for run in runs])


def seconds_range(runs: list[dict[str, str]]) -> str:
    wall = [float(run["wall_seconds"]) for run in runs]
    return f"{min(wall):.0f}-{max(wall):.0f} s"


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


class Runs(NamedTuple):
    """A study's runs of one row (``where``: only those whose column holds the value)."""

    study: str
    row: str
    where: tuple[str, str] | None = None

    def load(self, results: Path) -> list[dict[str, str]]:
        runs = by_row(results / self.study / "runs.csv").get(self.row, [])
        where = self.where
        return [r for r in runs if r.get(ACC) and (not where or r[where[0]] == where[1])]

    def named(self, runs: list[dict[str, str]]) -> str:
        where = f" ({self.where[0]} {self.where[1]})" if self.where else ""
        return f'`{self.study}` "{self.row}"{where} seeds {seed_list(runs)}'


def seed_list(runs: list[dict[str, str]]) -> str:
    """The runs' seeds, consecutive ones as a range: "0-4, 7"."""
    spans: list[list[int]] = []
    for seed in sorted(int(run["seed"]) for run in runs):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


COMPARED = ("diversity_zoo", "diversity_zoo_ips_flowrl")
"""The studies at the comparison's setting (Expr24, 1500 steps, seeds 0-4)."""
FIELD: tuple[tuple[str, tuple[Runs, ...]], ...] = (
    *(
        (label, (Runs("diversity_zoo", row),))
        for label, row in (
            ("RapTB + SubM", "RapTB + SubM"),
            ("TB + RP", "TB + RP"),
            ("GRPO", "GRPO"),
            ("GRPO + entropy (0.01)", "GRPO + entropy"),
            ("DAPO (dynamic sampling, 3 rounds)", "DAPO"),
            ("UCPO (tau 0.2)", "UCPO"),
            ("Pass@k (k 4)", "Pass@k"),
            ("ROVER (tree, std-normalised)", "ROVER"),
            ("G²RPO, raptb's reading (lambda 0.1, cap 1000)", "G2RPO"),
        )
    ),
    ("IPS-GRPO (epsilon 0.01)", (Runs("diversity_zoo_ips_flowrl", "IPS-GRPO"),)),
    ("FlowRL (beta 15)", (Runs("diversity_zoo_ips_flowrl", "FlowRL"),)),
    (
        "G²RPO over ten seeds",
        (Runs("diversity_zoo", "G2RPO"), Runs("diversity_zoo_g2rpo", "G2RPO")),
    ),
    (
        "Pass@k over ten seeds",
        (Runs("diversity_zoo", "Pass@k"), Runs("diversity_zoo_passk", "Pass@k")),
    ),
    (
        "RapTB + SubM over ten seeds (as `default_seeds/pooled.md`)",
        (
            Runs("default_replay", "RapTB + SubM", ("replay.p_replay", "0.75,0.5")),
            Runs("default_seeds", "RapTB + SubM"),
        ),
    ),
    ("RapTB + SubM at 5000 steps (the main job now)", (Runs("horizon_5000", "RapTB + SubM"),)),
    ("G²RPO at 5000 steps", (Runs("horizon_5000_g2rpo", "G2RPO, 5,000 steps"),)),
    ("IPS-GRPO at 5000 steps", (Runs("horizon_5000_ips_flowrl", "IPS-GRPO, 5,000 steps"),)),
    ("FlowRL at 5000 steps", (Runs("horizon_5000_ips_flowrl", "FlowRL, 5,000 steps"),)),
    ("RapTB + SubM, buffer 1000, 10,000 steps", (Runs("horizon_10000_capacity", "RapTB + SubM"),)),
)
"""The field table's rows: a label and the runs it pools; a row without runs is left out."""
FIELD_COLUMNS = (  # (runs.csv key, decimals; None: 1 below a mean of 10, else 0)
    (ACC, 3),
    (DISTINCT, None),
    ("exact.uniformity", 3),
    ("exact.active_modes.90", 0),
    ("exact.kl_target_pi", 1),
)
DIVERGED = 0.1
"""Below this exact Acc a run did not learn, or diverged: its row shows each cell's range."""


def field_cell(values: list[float], decimals: int | None, by_seed: bool = False) -> str:
    """Mean ± 95% t half-width (left out where it rounds to 0), then the seeds' range where the
    half-width is at least half the mean, or where ``by_seed``, unless both ends round alike."""
    spread = Spread(values)
    if decimals is None:
        decimals = 1 if abs(spread.mean) < 10 else 0
    text = f"{spread.mean:,.{decimals}f}"
    if spread.n > 1 and round(spread.half, decimals) > 0:
        text += f" ± {spread.half:,.{decimals}f}"
    low, high = (f"{value:,.{decimals}f}" for value in (min(values), max(values)))
    if (by_seed or spread.half >= abs(spread.mean) / 2) and low != high:
        text += f" (seeds: {low}-{high})"
    return text


def field_target(results: Path) -> str:
    """The target's line: uniform over the task's solutions (``n_solutions`` of the runs)."""
    n = int(read_csv(results / COMPARED[0] / "runs.csv")[0]["n_solutions"])
    draws = int(DISTINCT.rsplit(".", 1)[1])
    distinct = n * (1 - (1 - 1 / n) ** draws)
    modes = -(-9 * n // 10)  # the fewest of n equal masses that hold 90%
    return f"| target (uniform over the {n:,}) | | 1 | {distinct:,.0f} | 1 | {modes:,} | 0 | |"


def field_table(rows=FIELD, results: Path = RESULTS) -> str:
    """Every method on Expr24 scored exactly, a line for each row of ``rows`` that has runs.
    Bold: the most accurate row of one COMPARED study whose E[distinct] exceeds the first row's."""
    lines = [
        "| method | runs (study, row, seeds) | exact Acc | E[distinct] at 6,400 | uniformity "
        "| modes holding 90% | KL(p*‖π\\|Y*) | train + eval per run |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    found = [(label, [(s, s.load(results)) for s in sources]) for label, sources in rows]
    found = [(label, parts) for label, parts in found if any(runs for _, runs in parts)]
    pooled = {label: [run for _, runs in parts for run in runs] for label, parts in found}
    coverage = {label: spread(runs, DISTINCT).mean for label, runs in pooled.items()}
    contenders = [
        (spread(pooled[label], ACC).mean, label)
        for label, parts in found[1:]
        if len(parts) == 1
        and parts[0][0].study in COMPARED
        and coverage[label] > coverage[found[0][0]]
    ]
    best = max(contenders, default=(0.0, None))[1]
    for label, parts in found:
        runs = pooled[label]
        by_seed = min(float(run[ACC]) for run in runs) < DIVERGED
        cells = [
            field_cell([float(run[key]) for run in runs], decimals, by_seed)
            if all(run.get(key) for run in runs)
            else ""
            for key, decimals in FIELD_COLUMNS
        ]
        if label == best:
            cells[:2] = [f"**{cell}**" for cell in cells[:2]]
        named = " + ".join(source.named(runs) for source, runs in parts if runs)
        lines.append(f"| {label} | {named} | " + " | ".join(cells) + f" | {seconds_range(runs)} |")
    lines.append(field_target(results))
    return "\n".join(lines) + "\n"


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
