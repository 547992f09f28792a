"""The pages quote what their results hold (benchmarks/pages.py), the README opens on its command,
and docs/layout.md names every module the package holds."""

from __future__ import annotations

import csv
import math
import re
import statistics
from pathlib import Path

import pytest
from scipy import stats

from tests.benchmarks import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages():
    return load_script("pages")


def test_every_page_agrees_with_its_results(pages, capsys):
    assert pages.main(["--check"]) == 0, capsys.readouterr().err


def test_a_number_edited_by_hand_is_found(pages):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- gen:readme-expect -->\n(.*?)<!-- /gen", text, re.DOTALL).group(1)
    edited = text.replace(block, block.replace("0.97", "0.98", 1))
    assert edited != text
    assert pages.stale_blocks(text, "README.md") == []
    assert pages.stale_blocks(edited, "README.md") == ["readme-expect"]


def test_an_unknown_block_is_refused(pages):
    with pytest.raises(KeyError, match="unknown generated block 'nope'"):
        pages.render("<!-- gen:nope -->\nx\n<!-- /gen:nope -->", "page.md")


def test_the_intervals_by_hand(pages):
    # 1, 2, 3: mean 2, sd 1, t_{2,0.975} = 4.302653 (tables of Student's t)
    spread = pages.Spread([1.0, 2.0, 3.0])
    assert spread.mean == pytest.approx(2.0)
    assert spread.half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert spread.one_run == pytest.approx(4.302653 * math.sqrt(4 / 3), rel=1e-6)
    assert spread.run_range(2, high=3.0) == "0.00-3.00"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_readme_opens_on_the_quickstart_and_the_ci_command():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert "## Quickstart" in lines[:40]
    quickstart = _section(readme, "## Quickstart")
    assert "pip install torch==2.13.0 && pip install -e . && raptb train" in quickstart
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in lines


LAYERS = ("core", "adapters", "app")


def _layout_by_layer() -> dict[str, str]:
    """docs/layout.md's text under each layer's paragraph (``core/`` —, ``adapters/`` —, ``app/`` —)
    and the rest ("Elsewhere")."""
    parts: dict[str, list[str]] = {}
    layer = "intro"
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        opening = re.match(r"`(core|adapters|app)/` ", line)
        if opening:
            layer = opening.group(1)
        elif line.startswith("Elsewhere"):
            layer = "elsewhere"
        parts.setdefault(layer, []).append(line)
    return {layer: "\n".join(lines) for layer, lines in parts.items()}


@pytest.mark.parametrize("layer", LAYERS)
def test_docs_layout_names_every_module_of_a_layer_and_no_other(layer):
    text = _layout_by_layer()[layer]
    modules = [p for p in sorted((ROOT / layer).rglob("*.py")) if p.name != "__init__.py"]
    stems = {path.stem for path in modules}
    gone = sorted(set(re.findall(r"`([A-Za-z_0-9]+)\.py`", text)) - stems)
    missing = sorted(
        str(path.relative_to(ROOT))
        for path in modules
        if f"`{path.stem}.py`" not in text and f"`{path.stem}`" not in text
    )
    assert gone == [], f"docs/layout.md names modules that {layer}/ does not hold"
    assert missing == [], f"docs/layout.md omits these modules of {layer}/"


def _field_rows(table: str) -> dict[str, list[str]]:
    """The field table's cells by method (its first column), from its markdown lines."""
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def _t_cell(values: list[float], decimals: int) -> str:
    """Mean ± half-width of scipy's 95% t-interval, formatted as the page's cells."""
    low, high = stats.t.interval(0.95, len(values) - 1, loc=0.0, scale=stats.sem(values))
    return f"{statistics.fmean(values):,.{decimals}f} ± {(high - low) / 2:,.{decimals}f}"


def _values(study: str, row: str, key: str) -> list[float]:
    with (ROOT / "benchmarks" / "results" / study / "runs.csv").open(newline="") as handle:
        return [float(run[key]) for run in csv.DictReader(handle) if run["row"] == row]


def test_the_field_table_by_an_independent_computation():
    page = (ROOT / "docs" / "rl-baselines.md").read_text()
    block = re.search(r"<!-- gen:field-table -->\n(.*?)<!-- /gen", page, re.DOTALL).group(1)
    rows = _field_rows(block)
    acc, distinct = "exact.acc", "exact.expected_distinct.6400"
    tb = rows["TB + RP"]
    assert tb[0] == '`diversity_zoo` "TB + RP" seeds 0-4'
    assert tb[1] == _t_cell(_values("diversity_zoo", "TB + RP", acc), 3)
    assert tb[2] == _t_cell(_values("diversity_zoo", "TB + RP", distinct), 0)
    ten = {
        key: _values("diversity_zoo", "G2RPO", key) + _values("diversity_zoo_g2rpo", "G2RPO", key)
        for key in (acc, distinct)
    }
    g2rpo = rows["G²RPO over ten seeds"]
    assert g2rpo[0] == '`diversity_zoo` "G2RPO" seeds 0-4 + `diversity_zoo_g2rpo` "G2RPO" seeds 5-9'
    assert g2rpo[1] == _t_cell(ten[acc], 3)
    # its coverage's interval is wider than half its mean: the seeds' range follows
    low, high = min(ten[distinct]), max(ten[distinct])
    assert g2rpo[2] == f"{_t_cell(ten[distinct], 0)} (seeds: {low:,.0f}-{high:,.0f})"


def _study(results: Path, study: str, runs: list[tuple[str, int, float, float]]) -> None:
    """A runs.csv of (row, seed, exact Acc, E[distinct]) with fixed other columns."""
    (results / study).mkdir(parents=True)
    head = "row,seed,exact.acc,exact.expected_distinct.6400,exact.uniformity,"
    head += "exact.active_modes.90,exact.kl_target_pi,wall_seconds,n_solutions\n"
    lines = [
        f'"{r}",{s},{a},{d},0.5,{round(d)},{20 + s / 10},{100 + s},10\n' for r, s, a, d in runs
    ]
    (results / study / "runs.csv").write_text(head + "".join(lines))


def test_a_row_without_runs_is_left_out_and_the_bold_follows_its_rule(pages, tmp_path):
    three = (0, 1, 2)
    _study(
        tmp_path,
        "diversity_zoo",
        [("ours", s, 0.8, 100.0 + s) for s in three]
        + [("narrow", s, 0.99, 2.0) for s in three]  # the most accurate, but narrower than ours
        + [("broad", s, 0.90 + s / 100, 300.0) for s in three]  # broader than ours: bold
        + [("broader", s, 0.85, 900.0) for s in three]  # broader still, less accurate
        + [("diverged", s, 0.05 if s == 2 else 0.95, 50.0) for s in three],
    )
    _study(tmp_path, "diversity_zoo_ips_flowrl", [("IPS-GRPO", s, 0.99, 1.0) for s in three])
    field = load_script("field_table")
    runs = field.Runs
    names = ("ours", "narrow", "broad", "broader", "diverged")
    rows = [(name, (runs("diversity_zoo", name),)) for name in names] + [
        ("IPS-GRPO", (runs("diversity_zoo_ips_flowrl", "IPS-GRPO"),)),
        ("FlowRL", (runs("diversity_zoo_ips_flowrl", "FlowRL"),)),
    ]
    table = _field_rows(field.field_table(rows, tmp_path))
    assert list(table) == [*names, "IPS-GRPO", "target (uniform over the 10)"]
    assert [name for name, cells in table.items() if "**" in "".join(cells)] == ["broad"]
    assert table["broad"][1] == "**0.910 ± 0.025**"  # 0.90, 0.91, 0.92: t_{2} 4.303 x 0.01 / √3
    assert table["ours"][1:3] == ["0.800", "101 ± 2"]  # a zero half-width is left out
    # a seed below exact Acc 0.1: every cell whose seeds differ shows their range
    assert table["diverged"][1] == "0.650 ± 1.291 (seeds: 0.050-0.950)"
    assert table["diverged"][2] == "50"
    assert table["diverged"][5] == "20.1 ± 0.2 (seeds: 20.0-20.2)"  # narrow, but a seed diverged
    assert table["ours"][5] == "20.1 ± 0.2"
    # uniform over 10 solutions: E[distinct] in 6,400 draws 10 (1 - 0.9^6400), 9 hold 90%
    assert table["target (uniform over the 10)"][:6] == ["", "1", "10", "1", "9", "0"]
