"""The field side by side on Expr24: each method's exact accuracy against its coverage of the
solution set and its uniformity over it, from the committed runs of the diversity studies.

Usage (from the repository root):

    python benchmarks/diversity_zoo.py [--runs benchmarks/results/diversity_zoo/runs.csv
        benchmarks/results/diversity_zoo_ips_flowrl/runs.csv ...]
        [--out benchmarks/results/diversity_zoo]

Reads the per-run values ``raptb study`` wrote (``runs.csv``: ``exact.acc`` = pi(Y*),
``exact.expected_distinct.6400`` the expected distinct correct expressions in N = 6400 draws,
``exact.uniformity`` = H(pi|Y*) / log |Y*|, ...), groups them by row (method) over seeds (mean
with a 95% t-interval), and writes ``frontier.md`` (the table) and ``frontier.png`` (two panels:
exact Acc against E[distinct], and against uniformity), with the paper's two Expr24 points
(Llama-3.2-1B; its Unique is the sampled count at N = 6400) and the target itself (uniform over
the 75,445 solutions: Acc 1, E[distinct] 6,136, uniformity 1). Up and to the right is better.

With ``--unseen benchmarks/results/diversity_zoo_unseen/runs.csv`` it also writes ``unseen.md``:
each run of that study (a method run as the main job at a seed the comparison did not use) beside
the comparison's 95% interval of the mean and its 95% prediction interval for one more run
(mean ± t_{S-1,0.975} sd sqrt(1 + 1/S)), and whether the run lies inside each.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script's sibling, from any caller
from field_table import COMPARED

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (  # (runs.csv key, table header, decimals)
    ("exact.acc", "exact Acc", 3),
    ("exact.expected_distinct.6400", "E[Unique✓] at 6,400", 1),
    ("exact.tv_target_pi_all", "TV to target", 3),
    ("exact.kl_target_pi", "KL(p*‖π|Y*)", 2),
    ("exact.uniformity", "uniformity", 3),
    ("exact.active_modes.90", "modes (90%)", 0),
    ("pass_at_k.64", "pass@64", 3),
    ("steps", "steps", 0),
    ("wall_seconds", "train + eval s", 0),
)
PAPER = {"RapTB + SubM (paper)": (0.994, 1337.3), "TB + RP (paper)": (1.000, 5.3)}
TARGET = {"target": (1.0, 6136.1, 1.0)}
STUDIES = COMPARED
"""The studies at the comparison's setting (1500 steps, seeds 0-4): the field, then IPS-GRPO and
FlowRL (a row that has no runs yet is left out); the field table's (benchmarks/field_table.py)."""


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, half


def prediction(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of the 95% prediction interval for one more value."""
    mean, half = interval(values)  # t sd / sqrt(n); the prediction's is t sd sqrt(1 + 1/n)
    return mean, half * math.sqrt(len(values) + 1) if len(values) > 1 else math.inf


UNSEEN_KEYS = ("exact.acc", "exact.expected_distinct.6400", "exact.uniformity")


def unseen_table(rows: dict[str, dict[str, list[float]]], path: Path) -> str:
    """One line per run of ``path`` (a runs.csv): its values against the comparison's row."""
    head = ["method", "seed"] + [
        f"{h} (run; mean ± CI; prediction)" for k, h, _ in COLUMNS if k in UNSEEN_KEYS
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---|" * len(UNSEEN_KEYS)]
    with path.open() as handle:
        for run in csv.DictReader(handle):
            study = rows.get(run["row"], {})
            cells = []
            for key, _, decimals in COLUMNS:
                if key not in UNSEEN_KEYS:
                    continue
                value, values = float(run[key]), study.get(key, [])
                if not values:
                    cells.append(f"{value:.{decimals}f}; not in the comparison")
                    continue
                (mean, half), (_, wide) = interval(values), prediction(values)
                # within the rounding the tables print: a run equal to a zero-width mean is in it
                slack = 0.5 * 10.0**-decimals
                inside = [
                    "in" if abs(value - mean) <= width + slack else "out" for width in (half, wide)
                ]
                cells.append(
                    f"{value:.{decimals}f}; {mean:.{decimals}f} ± {half:.{decimals}f} "
                    f"({inside[0]}); ± {wide:.{decimals}f} ({inside[1]})"
                )
            lines.append(f"| {run['row']} | {run['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def by_row(paths: list[Path]) -> dict[str, dict[str, list[float]]]:
    """row -> metric -> the values of its runs (seeds), over every runs.csv given."""
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with path.open() as handle:
            for run in csv.DictReader(handle):
                for key, _, _ in COLUMNS:
                    if run.get(key) not in (None, ""):
                        rows[run["row"]][key].append(float(run[key]))
    return rows


def table(rows: dict[str, dict[str, list[float]]]) -> str:
    head = "| method | seeds | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(COLUMNS)]
    for name, metrics in rows.items():
        cells = []
        for key, _, decimals in COLUMNS:
            values = metrics.get(key, [])
            if not values:
                cells.append("")
                continue
            mean, half = interval(values)
            cells.append(f"{mean:.{decimals}f} ± {half:.{decimals}f}")
        seeds = max((len(v) for v in metrics.values()), default=0)
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: dict[str, dict[str, list[float]]], out: Path) -> None:
    """Each method's mean (large marker) and its seeds (small markers of the same colour): with
    two or three seeds a t-interval spans more than the axes, so the seeds themselves are shown."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colours = plt.get_cmap("tab10")
    keys = ("exact.expected_distinct.6400", "exact.uniformity")
    for i, (name, metrics) in enumerate(rows.items()):
        colour, marker = colours(i % 10), "os^"[i // 10 % 3]  # past ten methods, a new shape
        acc = metrics["exact.acc"]
        for ax, key in zip(axes, keys, strict=True):
            xs = metrics.get(key, [])
            if not xs:
                continue
            ax.scatter(xs, acc, s=14, color=colour, marker=marker, alpha=0.45)
            ax.scatter(
                statistics.fmean(xs),
                statistics.fmean(acc),
                s=70,
                marker=marker,
                color=colour,
                edgecolor="black",
                label=name if key == keys[0] else None,
            )
    for name, (acc, distinct) in PAPER.items():
        axes[0].plot(distinct, acc, marker="*", markersize=13, linestyle="", label=name)
    for name, (acc, distinct, uniform) in TARGET.items():
        axes[0].plot(distinct, acc, marker="X", color="black", linestyle="", label=name)
        axes[1].plot(uniform, acc, marker="X", color="black", linestyle="")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("E[distinct correct] at N = 6,400 (exact)")
    axes[1].set_xlabel("uniformity over the solutions, H(π|Y*) / log |Y*|")
    axes[1].set_xlim(-0.03, 1.03)
    for ax in axes:
        ax.set_ylabel("exact Acc = π(Y*)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="center left")
    fig.suptitle("Expr24, embedded model, 1500 steps: each method's mean (large) and seeds (small)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        type=Path,
        default=[RESULTS / study / "runs.csv" for study in STUDIES],
        help="runs.csv files, pooled by row (default: "
        + " and ".join(f"benchmarks/results/{study}/runs.csv" for study in STUDIES)
        + ")",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "diversity_zoo")
    parser.add_argument(
        "--unseen", type=Path, help="runs.csv of runs at seeds the study did not use"
    )
    args = parser.parse_args()
    rows = by_row(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontier.md").write_text(table(rows))
    plot(rows, args.out / "frontier.png")
    print(table(rows))
    if args.unseen is not None:
        text = unseen_table(rows, args.unseen)
        (args.out / "unseen.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
