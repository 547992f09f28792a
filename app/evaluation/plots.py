"""PNG plots written by evaluation: lengths, prefix diagnostics, score by length, pass@k, training
curves, and the exact evaluation's distinct-correct and correct-mass curves.

Figures are built on :class:`matplotlib.figure.Figure` directly (Agg canvas) rather than through
``pyplot``, so that plotting neither needs a display nor changes the process-wide backend or
keeps figures alive in pyplot's registry. Each function takes data and an output path, creates
the parent folder, writes a PNG and returns the path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from raptb.app.run_dir.run_log import read_log
from raptb.core.metrics import PrefixDiagnostics

TRAINING_CURVES = (
    ("loss", "loss"),
    ("log_z", "log Z"),
    ("acc", "accuracy"),
    ("unique_correct", "distinct correct samples"),
)


def _save(figure: Figure, path: str | Path) -> Path:
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(output, format="png", dpi=110)
    return output


def plot_length_histogram(
    lengths: Iterable[int], path: str | Path, title: str = "Valid samples by length"
) -> Path:
    """Bar chart of the number of (valid) samples per pre-stop length."""
    values = np.asarray(list(lengths), dtype=np.int64)
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    if values.size:
        sizes, counts = np.unique(values, return_counts=True)
        axes.bar(sizes, counts, width=0.8, color="tab:blue")
        axes.set_xticks(sizes)
    else:
        axes.text(0.5, 0.5, "no valid samples", ha="center", va="center")
    axes.set_xlabel("length (tokens before stop)")
    axes.set_ylabel("count")
    axes.set_title(title)
    return _save(figure, path)


def plot_prefix_diagnostics(
    diagnostics: PrefixDiagnostics | Mapping[str, Sequence[float]], path: str | Path
) -> Path:
    """Surv(k), PefEnt(k) and Top1(k) against depth k, one panel each.

    Accepts a :class:`PrefixDiagnostics` or its ``to_dict()`` form (as in metrics.json).
    """
    data = diagnostics.to_dict() if isinstance(diagnostics, PrefixDiagnostics) else diagnostics
    figure = Figure(figsize=(11, 3.5), layout="constrained")
    panels = (("surv", "Surv(k)"), ("pef_ent", "PefEnt(k) [nats]"), ("top1", "Top1(k)"))
    for index, (key, label) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, len(panels), index)
        axes.plot(data["depth"], data[key], marker="o")
        axes.set_xlabel("prefix depth k")
        axes.set_title(label)
        axes.grid(alpha=0.3)
    figure.suptitle("Prefix diagnostics (valid samples)")
    return _save(figure, path)


def _bars_by_length(
    heights: Mapping[int, float],
    counts: Mapping[int, int],
    ylabel: str,
    title: str,
    empty: str,
    color: str | None = None,
) -> Figure:
    """Bars of ``heights[n]`` against length n with ``n=<count>`` above each bar."""
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    sizes = sorted(heights)
    if sizes:
        bars = axes.bar(sizes, [heights[n] for n in sizes], width=0.8, color=color)
        axes.bar_label(bars, labels=[f"n={int(counts[n])}" for n in sizes])
        # Headroom so the count labels above the tallest bar stay inside the axes.
        axes.margins(y=0.12)
        axes.set_xticks(sizes)
    else:
        axes.text(0.5, 0.5, empty, ha="center", va="center")
    axes.set_xlabel("length (tokens before stop)")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    return figure


def plot_score_by_length(lengths: Iterable[int], scores: Iterable[float], path: str | Path) -> Path:
    """Mean task score per length with the sample count written above each bar."""
    sizes = np.asarray(list(lengths), dtype=np.int64)
    values = np.asarray(list(scores), dtype=np.float64)
    if sizes.shape != values.shape:
        raise ValueError(f"lengths and scores differ in shape: {sizes.shape} vs {values.shape}")
    unique_sizes = [int(n) for n in np.unique(sizes)]
    means = {n: float(values[sizes == n].mean()) for n in unique_sizes}
    counts = {n: int((sizes == n).sum()) for n in unique_sizes}
    figure = _bars_by_length(
        means, counts, "mean score", "Score by length", "no samples", color="tab:green"
    )
    return _save(figure, path)


def plot_pass_at_k(pass_at_k: Mapping[str, float | None], path: str | Path) -> Path:
    """pass@k against k (log scale) from metrics.json's ``pass_at_k``; a k without an estimate
    (fewer than k samples in a prompt) is left out and named in the title."""
    points = sorted((int(k), v) for k, v in pass_at_k.items() if v is not None)
    missing = sorted(int(k) for k, v in pass_at_k.items() if v is None)
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    if points:
        ks, values = zip(*points, strict=True)
        axes.plot(ks, values, marker="o")
        axes.set_xscale("log", base=2)
        axes.set_xticks(ks, [str(k) for k in ks])
    else:
        axes.text(0.5, 0.5, "no k with enough samples", ha="center", va="center")
    axes.set_ylim(0, 1.05)
    axes.set_xlabel("k")
    axes.set_ylabel("pass@k (unbiased)")
    title = "pass@k (mean over prompts)"
    if missing:
        title += f"; n < k for k = {', '.join(map(str, missing))}"
    axes.set_title(title)
    axes.grid(alpha=0.3)
    return _save(figure, path)


def plot_exact_diversity(exact: Mapping[str, Any], path: str | Path) -> Path:
    """Two panels from exact.json: E[distinct correct] at N draws against N, the policy's and
    the target's (``distinct_curve``, ``target_distinct_curve``); and the share of the correct
    mass held by the r most probable solutions against r (``correct_mass_curve``), with the
    target's (r / |Y*|) and the 50% and 90% lines that define the active modes."""
    figure = Figure(figsize=(11, 4), layout="constrained")
    left = figure.add_subplot(1, 2, 1)
    for key, label, style in (
        ("distinct_curve", "policy", "-"),
        ("target_distinct_curve", "target (uniform over Y*)", "--"),
    ):
        points = sorted((int(n), v) for n, v in exact[key].items())
        left.plot(*zip(*points, strict=True), style, marker="o", label=label)
    left.set_xscale("log", base=2)
    left.set_xlabel("N draws")
    left.set_ylabel("E[distinct correct]")
    left.set_title("Expected distinct solutions at N")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    right = figure.add_subplot(1, 2, 2)
    curve = sorted((int(r), v) for r, v in exact["correct_mass_curve"].items())
    if curve:
        ranks = np.array([r for r, _ in curve], dtype=np.float64)
        right.plot(ranks, [v for _, v in curve], marker="o", label="policy")
        right.plot(ranks, ranks / exact["n_solutions"], "--", label="target")
        modes = exact["active_modes"]
        for share, color in (("50", "tab:gray"), ("90", "tab:red")):
            right.axhline(int(share) / 100, color=color, lw=0.8, ls=":")
            right.axvline(
                modes[share], color=color, lw=0.8, ls=":", label=f"{share}%: {modes[share]:,}"
            )
        right.set_xscale("log", base=2)
        right.legend(fontsize=8)
    else:
        right.text(0.5, 0.5, "no correct mass", ha="center", va="center")
    right.set_xlabel("r most probable solutions")
    right.set_ylabel("share of the correct mass")
    right.set_title(f"Active modes (uniformity {exact['uniformity']:.3f})")
    right.grid(True, which="both", alpha=0.3)
    return _save(figure, path)


def plot_metric_by_length(
    by_length: Mapping[str, Mapping[str, float]], key: str, path: str | Path, title: str
) -> Path:
    """Bar chart of ``by_length[n][key]`` against length n (a metrics.json per-length table),
    with each length's sample ``count`` above its bar."""
    heights = {int(n): row[key] for n, row in by_length.items()}
    counts = {int(n): int(row["count"]) for n, row in by_length.items()}
    figure = _bars_by_length(heights, counts, key, title, "no valid samples")
    return _save(figure, path)


def plot_training_curves(
    metrics_log: str | Path | Sequence[Mapping[str, Any]], path: str | Path
) -> Path:
    """Loss, log Z, accuracy and distinct correct samples against ``step``.

    ``metrics_log`` is a ``metrics.jsonl`` path or its records. A record missing ``step`` uses
    its index; a record missing a curve's key (or with a non-numeric value) is left out of
    that curve, and a curve with no points says so in its panel.
    """
    records = read_log(Path(metrics_log)) if isinstance(metrics_log, str | Path) else metrics_log
    figure = Figure(figsize=(10, 7), layout="constrained")
    for index, (key, label) in enumerate(TRAINING_CURVES, start=1):
        axes = figure.add_subplot(2, 2, index)
        points = [
            (record.get("step", position), record[key])
            for position, record in enumerate(records)
            if isinstance(record.get(key), int | float) and not isinstance(record[key], bool)
        ]
        if points:
            steps, values = zip(*points, strict=True)
            axes.plot(steps, values)
        else:
            axes.text(0.5, 0.5, f"no '{key}' logged", ha="center", va="center")
        axes.set_xlabel("step")
        axes.set_title(label)
        axes.grid(alpha=0.3)
    figure.suptitle("Training curves")
    return _save(figure, path)


#: Series of ``plot_subm_scaling``: key in a bench record's ``selection_ms`` (or the record's
#: ``similarity_ms``) and its legend label.
SUBM_SERIES = (
    ("lazy", "lazy (fixed-point cache, buffer path)"),
    ("lazy-float", "lazy from float32 (rounding + symmetry check)"),
    ("standard", "standard greedy"),
    ("numpy-lazy", "numpy lazy baseline"),
    ("apricot-warm", "apricot FacilityLocation (warm)"),
    ("dispersion", "dispersion rule (lazy)"),
    ("similarity", "similarity refresh (new x all)"),
)


def plot_subm_scaling(records: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Log-log refresh time against |G| for the sweep records of ``raptb bench subm`` (the
    paper-setting records, B = 200 at |G| = 232, are left out: they are not on the B = |G|/8
    line)."""
    sweep = sorted(
        (r for r in records if r["budget"] * 8 == r["n"] and r["backend"] == "tanimoto"),
        key=lambda r: r["n"],
    )
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.add_subplot()
    for key, label in SUBM_SERIES:
        points = [
            (r["n"], r["similarity_ms"] if key == "similarity" else r["selection_ms"].get(key))
            for r in sweep
        ]
        points = [(n, ms) for n, ms in points if ms is not None]
        if points:
            style = "--" if key == "similarity" else "-"
            ax.plot(*zip(*points, strict=True), style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("|G| (ground set; B = |G| / 8)")
    ax.set_ylabel("ms per refresh (median)")
    ax.set_title("SubM refresh: selection time by method")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(figure, path)
