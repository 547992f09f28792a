"""Configuration as the single source of defaults: descriptions, help texts, the docs' table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.adapters.tasks.registry import builtin_task_names
from raptb.app.cli import app
from raptb.app.configuration.config import ObjectiveConfig
from raptb.app.configuration.reference import TABLE_END, TABLE_START, config_fields, markdown_table
from raptb.core.gfn.objectives import OBJECTIVES

REFERENCE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BUILTIN_TASKS = builtin_task_names()


def test_every_field_is_described() -> None:
    missing = [path for path, field in config_fields() if not field.description]
    assert missing == []


def test_reference_table_is_generated_from_the_model() -> None:
    text = REFERENCE_PAGE.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    # the shipped tasks only: other tests register a toy task in this process
    assert text[start:end].strip() == markdown_table(BUILTIN_TASKS).strip()


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_objective_config_defaults_equal_the_core_defaults(name: str) -> None:
    # k_min is a schedule in the config (the paper's 7 -> 3) and a constant in core, by design
    config_defaults = ObjectiveConfig().model_dump()
    for field in dataclasses.fields(OBJECTIVES[name]):
        if field.name == "k_min" or config_defaults.get(field.name) is None:
            continue  # None in the config keeps the objective's own default
        assert config_defaults[field.name] == field.default, (name, field.name)


def test_help_texts_come_from_the_config_and_keep_brackets() -> None:
    runner = CliRunner()
    train = runner.invoke(app, ["train", "--help"], terminal_width=200)
    assert train.exit_code == 0
    help_text = " ".join(train.output.split())
    assert "[custom] of --config" in help_text and "[smiles] of --config" in help_text
    assert "Policy learning rate. [default: (0.001; pretrained models: 0.0001)]" in help_text
    assert "(default: 1e-3" not in help_text
    evaluation = " ".join(runner.invoke(app, ["eval", "--help"], terminal_width=200).output.split())
    assert re.search(r"expr24 6400, smiles 3200", evaluation)


def test_version_flag_prints_the_package_version() -> None:
    from importlib.metadata import version

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"raptb {version('raptb')}"
