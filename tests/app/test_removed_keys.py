"""Configuration keys that were removed (app/configuration/removed_keys.py): a run's config.toml
written before still loads, the same file passed as ``--config`` is refused in one line, exit 2,
and docs/configuration.md lists every one."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.configuration.record import config_toml
from raptb.app.configuration.removed_keys import REMOVED
from raptb.app.configuration.sections import OptimConfig
from raptb.app.run_dir.run_config import load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _recorded_before(tmp_path: Path, keys: list[str]) -> tuple[Path, Path]:
    """A run's config.toml as written today, and the same with ``keys`` (removed [optim] keys)
    recorded as a run before their removal wrote them."""
    now = tmp_path / "now.toml"
    now.write_text(config_toml(build_config(overrides={"seed": 7, "steps": 3})))
    before = tmp_path / "before.toml"
    lines = "".join(f"{key} = true\n" for key in keys)
    before.write_text(now.read_text().replace("[optim]\n", f"[optim]\n{lines}"))
    assert before.read_text() != now.read_text()
    return now, before


def test_the_removed_keys_are_no_fields() -> None:
    assert all(section == "optim" for section, _ in REMOVED)
    assert not {key for _, key in REMOVED} & set(OptimConfig.model_fields)


def test_a_run_folders_config_from_before_still_loads(tmp_path: Path) -> None:
    now, before = _recorded_before(tmp_path, [key for _, key in REMOVED])
    assert load_config(before) == load_config(now)


@pytest.mark.parametrize(("section", "key"), sorted(REMOVED))
def test_one_removed_key_in_a_users_file_is_refused_in_one_line_exit_2(tmp_path, section, key):
    _, before = _recorded_before(tmp_path, [key])
    with pytest.raises(ConfigError, match=f"^invalid config: {section}.{key}: removed; "):
        build_config(before)
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(before), "--out", str(run)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: invalid config: {section}.{key}: removed; the path it chose always runs "
        f"({REMOVED[section, key]}); delete it from the file"
    ]
    assert not run.exists()


def test_several_are_named_in_one_line(tmp_path: Path) -> None:
    _, before = _recorded_before(tmp_path, ["tanh_gelu", "merge_copies"])
    result = CliRunner().invoke(app, ["train", "--config", str(before), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: invalid config: optim.merge_copies, optim.tanh_gelu: removed; the paths they "
        'chose always run (docs/configuration.md, "Removed keys"); delete them from the file'
    ]


def test_the_docs_list_every_removed_key() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Removed keys") :]
    listed = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert listed == [f"{section}.{key}" for section, key in REMOVED]


def test_a_run_from_before_resumes(tmp_path: Path) -> None:
    """``--resume`` reads the run's own config.toml as its record: the removed keys it holds are
    dropped, and the run continues."""
    run = tmp_path / "run"
    args = ["train", "--steps", "1", "--threads", "1", "--optim.batch_size", "8"]
    assert CliRunner().invoke(app, [*args, "--out", str(run)]).exit_code == 0
    recorded = run / "config.toml"
    removed = "".join(f"{key} = true\n" for _, key in REMOVED)
    recorded.write_text(recorded.read_text().replace("[optim]\n", f"[optim]\n{removed}"))
    resumed = ["train", "--resume", "--out", str(run), "--steps", "2", "--threads", "1"]
    result = CliRunner().invoke(app, resumed)
    assert result.exit_code == 0, result.output
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
