"""``raptb enumerate expr24``: table and JSON output through the real Typer app."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app

EXPECTED = {"3": 4, "5": 82, "7": 2520, "9": 72839}


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAPTB_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_json_counts(cache_dir: Path) -> None:
    result = CliRunner().invoke(app, ["enumerate", "expr24", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload == {"task": "expr24", "counts": EXPECTED, "total": 75_445}
    assert list(cache_dir.glob("*.json")), "the solution set was not cached"


def test_table_lists_every_length(cache_dir: Path) -> None:
    result = CliRunner().invoke(app, ["enumerate", "expr24"])
    assert result.exit_code == 0, result.output
    # the table's body rows, "│ length │ solutions │", in order (the title and header excluded)
    rows = re.findall(r"^│\s*(\w+)\s*│\s*([\d,]+)\s*│$", result.output, flags=re.MULTILINE)
    expected = [(length, f"{count:,}") for length, count in EXPECTED.items()]
    assert rows == [*expected, ("total", "75,445")]


def test_unknown_task_is_a_usage_error(cache_dir: Path) -> None:
    result = CliRunner().invoke(app, ["enumerate", "smiles"])
    assert result.exit_code == 2
    assert "'smiles' is not an enumerable task; choose from expr24" in result.output
    assert not list(cache_dir.glob("*.json"))  # refused before any enumeration
