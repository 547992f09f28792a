"""``raptb bench subm``: the numpy baseline is a correct lazy greedy, and the command reports
every timing it promises (tiny sizes; timings themselves are not asserted)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import raptb.app.evaluation.bench as bench_module
from raptb.app.cli import app
from raptb.app.evaluation.bench import numpy_lazy_greedy
from raptb.core.subm.select import SCALE, QuantisedSimilarity, subm_select


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 50), w_len=st.floats(0.0, 2.0))
def test_numpy_baseline_selects_like_subm_select(seed, n, w_len):
    # Grid values (so both see the same similarity) from continuous data (so gains are tie-free).
    rng = np.random.default_rng(seed)
    x = rng.random((n, 3))
    sim = np.exp(-3.0 * np.linalg.norm(x[:, None] - x[None], axis=-1))
    sim = (np.round(sim * SCALE) / SCALE).astype(np.float32)
    static = rng.random(n)
    bins = rng.integers(0, 4, n)
    budget = max(1, n // 3)
    want = subm_select(QuantisedSimilarity.from_float(sim), static, bins, budget, w_len=w_len)
    assert numpy_lazy_greedy(sim, static, bins, budget, 1.0, w_len) == want.tolist()


def test_bench_subm_json_reports_every_method():
    result = CliRunner().invoke(app, ["bench", "subm", "--sizes", "64", "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)["records"]
    assert [(r["n"], r["budget"], r["backend"]) for r in records] == [
        (232, 200, "tanimoto"),
        (232, 200, "jaccard"),
        (64, 8, "tanimoto"),
    ]
    for rec in records:
        sel = rec["selection_ms"]
        for name in (
            "lazy",
            "lazy-float",
            "lazy-float-nocheck",
            "standard",
            "numpy-lazy",
            "dispersion",
        ):
            assert sel[name] > 0.0, name
        assert rec["similarity_ms"] > 0.0
        assert rec["total_lazy_ms"] == rec["similarity_ms"] + sel["lazy"]
        assert rec["lazy_speedup_vs_numpy"] == sel["numpy-lazy"] / sel["lazy"]
        assert isinstance(rec["numpy_lazy_same_selection"], bool)
        if bench_module._apricot() is not None:
            assert sel["apricot-first"] > 0.0 and sel["apricot-warm"] > 0.0


def test_bench_subm_table_plot_and_bad_data(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_module, "_apricot", lambda: None)  # its timing path: test above
    runner = CliRunner()
    png = tmp_path / "plots" / "scaling.png"
    args = ["bench", "subm", "--sizes", "32,64", "--repeats", "1", "--plot", str(png)]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in table.output.splitlines() if line.startswith("| 232 ")]
    assert len(rows) == 2 and all(row.count("|") == 18 for row in rows)
    bad = runner.invoke(app, ["bench", "subm", "--data", "nope"])
    assert bad.exit_code == 2
