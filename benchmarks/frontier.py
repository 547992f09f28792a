"""Every Expr24 setting tried on the embedded model as one point: exact Acc against E[distinct].

Usage (from the repository root):

    python benchmarks/frontier.py [--out benchmarks/results/headline/frontier.png]
    python benchmarks/frontier.py --studies horizon_5000 horizon_5000_frontier \
        horizon_5000_capacity horizon_frontier_more horizon_10000_capacity horizon_5000_g2rpo \
        horizon_5000_ips_flowrl mode_bonus_5000 mode_bonus_schedule mode_bonus_seeds \
        --out benchmarks/results/horizon_5000/frontier.png \
        --title "Expr24, embedded model, 5,000 and 10,000 steps" --ymin 0.7 --ceiling

Reads the committed per-run values of the studies that evaluate exactly
(``benchmarks/results/<study>/runs.csv``: ``exact.acc`` = pi(Y*) and
``exact.expected_distinct.6400``, the expected number of distinct correct expressions in
N = 6400 draws), groups the runs of each setting over their seeds (mean, with a 95% t-interval
as error bars), and draws them beside the maximum-likelihood ceiling of
``benchmarks/ceiling.py`` (``benchmarks/results/headline/ceiling.json``, 180 CPU-seconds, and
``ceiling_long.json``, 600 on a fixed 1,500 solutions), the paper's Expr24 table
(Llama-3.2-1B; its Unique is the sampled count at N = 6400) and the target itself (uniform over
the 75,445 solutions: Acc 1, E[distinct] 6,136). Up and to the right is better on both axes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from scipy import stats

RESULTS = Path(__file__).resolve().parent / "results"
STUDIES = (
    "default_model",
    "log_z_regimes",
    "default_screen",
    "default_replay",
    "default_seeds",
    "default_capacity",
    "default_capacity_replay",
)
"""Studies whose runs.csv carry exact.acc (in the order their legends list)."""
ACC, DISTINCT = "exact.acc", "exact.expected_distinct.6400"
NOT_SETTING = {"seed", "wall_seconds", "n_samples", "n_solutions", "target_unique"}
PAPER = {  # the paper's Expr24 table: (Acc, Unique at N = 6400), Llama-3.2-1B
    "TB + RP": (1.000, 5.3),
    "RapTB + RP": (0.991, 246.7),
    "TB + PRT": (0.999, 103.7),
    "RapTB + PRT": (0.992, 129.3),
    "TB + SubM": (0.996, 642.0),
    "RapTB + SubM": (0.994, 1337.3),
    "TB + Oracle": (0.919, 5198.0),
    "RapTB + Oracle": (0.945, 5220.7),
}
TARGET = (1.0, 6136.1)


def interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval; 0 with one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = float(stats.t.ppf(0.975, len(values) - 1))
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def settings(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Runs of one study's runs.csv grouped by setting: label -> [(acc, distinct), ...]."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        # the axis and row columns come before "seed"; the metrics after it
        keys = header[: header.index("seed")]
        for row in reader:
            record = dict(zip(header, row, strict=False))
            if not record.get(ACC):
                continue
            label = ", ".join(f"{k}={record[k]}" if k != "row" else record[k] for k in keys)
            groups[label].append((float(record[ACC]), float(record[DISTINCT])))
    return groups


def ceiling_points(path: Path) -> list[tuple[str, float, float]]:
    """The last point of each maximum-likelihood fit of benchmarks/ceiling.py."""
    if not path.exists():
        return []
    record = json.loads(path.read_text())
    points = []
    for run in record["runs"]:
        last = run["curve"][-1]
        label = (
            f"MLE {run['layers']}x{run['width']} lr {run['lr']:g}, {run['subset']} sol., "
            f"{record['seconds']:g} CPU-s"
        )
        points.append((label, last["exact_acc"], last["expected_distinct"]))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "headline" / "frontier.png")
    parser.add_argument(
        "--ceiling",
        type=Path,
        nargs="*",
        default=[RESULTS / "headline" / name for name in ("ceiling.json", "ceiling_long.json")],
    )
    parser.add_argument(
        "--studies", nargs="+", default=list(STUDIES), help="results/<study>/runs.csv to draw"
    )
    parser.add_argument(
        "--title", default="Expr24 on the embedded 2 x 64 model: every setting tried"
    )
    parser.add_argument("--ymin", type=float, default=-0.02, help="lower end of the Acc axis")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(10, 7))
    # one colour per setting (40 before a colour repeats)
    ax.set_prop_cycle(color=plt.get_cmap("tab20").colors + plt.get_cmap("tab20b").colors)
    markers = iter("osD^v<>p*hX")
    for study in args.studies:
        path = RESULTS / study / "runs.csv"
        if not path.exists():
            continue
        marker = next(markers)
        for label, runs in settings(path).items():
            acc, acc_ci = interval([a for a, _ in runs])
            distinct, distinct_ci = interval([d for _, d in runs])
            ax.errorbar(
                distinct,
                acc,
                xerr=distinct_ci,
                yerr=acc_ci,
                fmt=marker,
                capsize=3,
                label=f"{study}: {label} (n={len(runs)})",
            )
    ceilings = [point for path in args.ceiling for point in ceiling_points(path)]
    for label, acc, distinct in ceilings:
        ax.plot(distinct, acc, "x", color="grey", markersize=8)
        ax.annotate(label, (distinct, acc), fontsize=7, color="grey")
    for label, (acc, unique) in PAPER.items():
        ax.plot(unique, acc, "*", color="black", markersize=9)
        ax.annotate(f"paper {label}", (unique, acc), fontsize=7, rotation=20)
    ax.plot(*reversed(TARGET), "P", color="red", markersize=11)
    ax.annotate("target (uniform over Y*)", tuple(reversed(TARGET)), fontsize=8, color="red")
    ax.set_xscale("log")
    ax.set_xlabel("E[distinct correct in N = 6400 draws] (exact)")
    ax.set_ylabel("exact Acc = pi(Y*)")
    ax.set_ylim(args.ymin, 1.05)
    ax.set_title(f"{args.title} (mean ± 95% CI)")
    ax.legend(fontsize=6, loc="lower left", bbox_to_anchor=(0, 0))
    ax.grid(alpha=0.3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
