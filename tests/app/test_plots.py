"""PNG plots: each function writes a non-empty PNG at the given path and returns it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raptb.app.evaluation import plots
from raptb.app.run_dir.run_log import read_log
from raptb.core.metrics import exact as em
from raptb.core.metrics import prefix_diagnostics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, expected: Path) -> None:
    assert path == expected
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 1000


def test_length_histogram(tmp_path: Path) -> None:
    target = tmp_path / "nested" / "lengths.png"
    assert_png(plots.plot_length_histogram([3, 5, 5, 9, 7, 5], target), target)
    empty = tmp_path / "empty.png"
    assert_png(plots.plot_length_histogram([], empty), empty)


def test_prefix_diagnostics_from_dataclass_and_dict(tmp_path: Path) -> None:
    diagnostics = prefix_diagnostics(["3*8", "4*6", "2*3*4", "3*8"], max_depth=9)
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    assert_png(plots.plot_prefix_diagnostics(diagnostics, first), first)
    assert_png(plots.plot_prefix_diagnostics(diagnostics.to_dict(), second), second)


def test_score_by_length(tmp_path: Path) -> None:
    target = tmp_path / "score.png"
    assert_png(plots.plot_score_by_length([3, 3, 5, 7], [1.0, 0.0, 1.0, 1.0], target), target)
    with pytest.raises(ValueError, match="lengths and scores"):
        plots.plot_score_by_length([3], [1.0, 2.0], target)


def test_training_curves_tolerate_missing_keys_and_bad_lines(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    records = [
        {"step": 1, "loss": 3.0, "log_z": 0.1, "acc": 0.0, "unique_correct": 0},
        {"step": 2, "loss": 2.0, "acc": 0.5},
        {"loss": 1.5, "log_z": 0.3, "unique_correct": 4},
    ]
    log.write_text(
        "\n".join(json.dumps(r) for r in records) + '\n\n[1, 2]\n{"step": 4, "lo', "utf-8"
    )
    assert read_log(log) == records
    target = tmp_path / "curves.png"
    assert_png(plots.plot_training_curves(log, target), target)
    only_loss = tmp_path / "only_loss.png"
    assert_png(plots.plot_training_curves([{"step": 0, "loss": 1.0}], only_loss), only_loss)


def test_pass_at_k_with_a_missing_k(tmp_path: Path) -> None:
    target = tmp_path / "pass.png"
    curve = {"1": 0.2, "8": 0.7, "64": 0.99, "256": None}
    assert_png(plots.plot_pass_at_k(curve, target), target)
    nothing = tmp_path / "nothing.png"
    assert_png(plots.plot_pass_at_k({"1": None}, nothing), nothing)


def test_exact_diversity_with_and_without_correct_mass(tmp_path: Path) -> None:
    exact = em.exact_metrics(np.log([0.1, 0.2, 0.3]), np.log([0.1, 0.2, 0.3]), [3, 5, 5], draws=[4])
    target = tmp_path / "exact.png"
    assert_png(plots.plot_exact_diversity(exact, target), target)
    none = em.exact_metrics(np.full(3, -np.inf), np.full(3, -np.inf), [3, 5, 5], draws=[4])
    empty = tmp_path / "empty.png"
    assert_png(plots.plot_exact_diversity(none, empty), empty)
