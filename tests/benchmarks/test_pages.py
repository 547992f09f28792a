"""The pages quote what their results hold (benchmarks/pages.py), the README opens on its command,
and docs/layout.md names every module the package holds."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

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
