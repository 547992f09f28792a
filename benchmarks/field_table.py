"""The field table of docs/rl-baselines.md (the block ``field-table`` that benchmarks/pages.py
writes): every method on Expr24 scored exactly, each row pooling the runs of the studies it names
(``benchmarks/results/<study>/runs.csv``), with the target (uniform over the solutions) for
scale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script's sibling, from any caller
from result_files import (
    ACC,
    DISTINCT,
    RESULTS,
    Spread,
    by_row,
    read_csv,
    seconds_range,
    spread,
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
    (
        "RapTB + SubM + G²RPO's bonus (lambda 1) at 5000 steps",
        tuple(
            Runs(s, "RapTB + SubM + bonus (lambda 1)")
            for s in ("mode_bonus_5000", "mode_bonus_seeds")
        ),
    ),
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
