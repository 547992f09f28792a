"""The README's main job over ten seeds: the runs of the embedded default (p_replay 0.75 -> 0.5,
logZ held at 0) from ``studies/default_replay.toml`` (seeds 0-4) and ``studies/default_seeds.toml``
(seeds 5-9), pooled.

Usage (from the repository root, after both studies' ``runs.csv`` are committed):

    python benchmarks/pooled_default.py [--out benchmarks/results/default_seeds/pooled.md]

For RapTB + SubM and TB + RP: the mean and 95% t-interval of exact Acc and E[distinct] over the
ten seeds, the 95% prediction interval of one more run (mean +- t_{n-1,0.975} sd sqrt(1 + 1/n):
where the README's main job at an unseen seed should land), each seed's coverage ratio, and
whether seeds 5-9 reproduce seeds 0-4 (Welch's t-test of the two halves).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

from scipy import stats

RESULTS = Path(__file__).resolve().parent / "results"
ACC, DISTINCT = "exact.acc", "exact.expected_distinct.6400"
METHODS = ("RapTB + SubM", "TB + RP")


def default_runs() -> dict[str, dict[int, tuple[float, float]]]:
    """method -> seed -> (exact Acc, E[distinct]) of the default setting, from both studies."""
    runs: dict[str, dict[int, tuple[float, float]]] = {m: {} for m in METHODS}
    sources = (
        ("default_replay", lambda r: r["replay.p_replay"] == "0.75,0.5"),
        ("default_seeds", lambda r: "p_replay" not in r["row"]),
    )
    for study, is_default in sources:
        with (RESULTS / study / "runs.csv").open(newline="") as handle:
            for record in csv.DictReader(handle):
                if record["row"] in runs and is_default(record) and record.get(ACC):
                    seed = int(record["seed"])
                    assert seed not in runs[record["row"]], f"seed {seed} twice"
                    runs[record["row"]][seed] = (float(record[ACC]), float(record[DISTINCT]))
    return runs


def summary(values: list[float]) -> tuple[float, float, float, float]:
    """(mean, 95% t half-width of the mean, low and high ends of the 95% prediction interval)."""
    n = len(values)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    t = float(stats.t.ppf(0.975, n - 1))
    spread = t * sd * math.sqrt(1 + 1 / n)
    return mean, t * sd / math.sqrt(n), mean - spread, mean + spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "default_seeds" / "pooled.md")
    args = parser.parse_args()
    runs = default_runs()
    lines = [
        "# The embedded default over ten seeds (seeds 0-4 and 5-9 pooled)",
        "",
        "`python benchmarks/pooled_default.py`: the README's main job (Expr24, the embedded 2 x 64",
        "model, p_replay 0.75 -> 0.5, logZ held at 0, 1500 steps) from",
        "[`default_replay`](../default_replay/table.md) (seeds 0-4) and",
        "[`default_seeds`](table.md) (seeds 5-9); exact evaluation. Mean ± 95% t-interval;",
        "PI: the 95% prediction interval of one more run (mean ± t sd sqrt(1 + 1/n)).",
        "",
        "| Method | n | exact Acc | PI | E[distinct] | PI | seeds 0-4 vs 5-9 (Welch p: Acc, "
        "distinct) |",
        "|:--|--:|--:|:--|--:|:--|:--|",
    ]
    for method in METHODS:
        seeds = sorted(runs[method])
        acc = [runs[method][s][0] for s in seeds]
        distinct = [runs[method][s][1] for s in seeds]
        a, a_ci, a_lo, a_hi = summary(acc)
        d, d_ci, d_lo, d_hi = summary(distinct)
        halves = [
            stats.ttest_ind(
                [runs[method][s][i] for s in seeds if s < 5],
                [runs[method][s][i] for s in seeds if s >= 5],
                equal_var=False,
            ).pvalue
            for i in (0, 1)
        ]
        lines.append(
            f"| {method} | {len(seeds)} | {a:.3f} ± {a_ci:.3f} | {a_lo:.2f} to {min(a_hi, 1):.2f} "
            f"| {d:.0f} ± {d_ci:.0f} | {max(d_lo, 0):.0f} to {d_hi:.0f} "
            f"| {halves[0]:.2f}, {halves[1]:.2f} |"
        )
    both = sorted(set(runs[METHODS[0]]) & set(runs[METHODS[1]]))
    ratios = [runs[METHODS[0]][s][1] / runs[METHODS[1]][s][1] for s in both]
    acc_gap = [runs[METHODS[0]][s][0] - runs[METHODS[1]][s][0] for s in both]
    r, r_ci, _, _ = summary(ratios)
    g, g_ci, _, _ = summary(acc_gap)
    welch = stats.ttest_ind(
        [runs[METHODS[0]][s][0] for s in both],
        [runs[METHODS[1]][s][0] for s in both],
        equal_var=False,
    ).pvalue
    lines += [
        "",
        f"Per seed ({len(both)} seeds), RapTB + SubM against TB + RP: E[distinct] ratio "
        f"{r:.1f} ± {r_ci:.1f} (seeds: {', '.join(f'{x:.1f}' for x in ratios)}); exact Acc "
        f"difference {g:+.3f} ± {g_ci:.3f} (Welch p = {welch:.2f}).",
        "",
        "| seed | RapTB + SubM exact Acc | E[distinct] | TB + RP exact Acc | E[distinct] |",
        "|--:|--:|--:|--:|--:|",
    ]
    for s in both:
        (a1, d1), (a2, d2) = runs[METHODS[0]][s], runs[METHODS[1]][s]
        lines.append(f"| {s} | {a1:.3f} | {d1:.0f} | {a2:.3f} | {d2:.0f} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
