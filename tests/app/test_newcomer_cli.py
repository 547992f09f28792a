"""What a newcomer reads first: ``raptb config --model`` (the preset a model resolves to, equal to
what ``raptb train`` runs) and ``raptb train --help`` opening with the common flags by panel."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.adapters.lm.models import SMOLLM2
from raptb.app.cli import app
from raptb.app.configuration.record import config_toml
from raptb.app.training import train
from raptb.app.training.train import TrainResult
from raptb.app.training.train_command import FIELDS_PANEL, OTHER_FLAGS_PANEL

# (model flags, values the presets resolve to, by hand from config.py's PRETRAINED_PRESET and
# TINY_PRESET over the fields' defaults; None: the field is unset, i.e. absent from the TOML)
PRESETS = [
    (
        ["--model", SMOLLM2],
        {"model": SMOLLM2, "reward.kappa": 1.0, "lora.rank": 16, "optim.lr": 1e-4,
         "optim.log_z_lr": 0.1, "threads": None, "optim.batch_size": 32, "optim.grad_accum": 4},
    ),
    (
        [],
        {"model": "tiny", "reward.kappa": 0.0, "lora.rank": None, "optim.lr": 1e-3,
         "optim.log_z_lr": 0.0, "threads": 1, "optim.batch_size": 128, "optim.grad_accum": 1},
    ),
]  # fmt: skip


def lookup(tree: dict, path: str) -> object:
    for part in path.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def config_of_train(args: list[str], tmp_path: Path, monkeypatch) -> str:
    """The configuration (TOML) that ``raptb train ARGS`` hands to its Trainer (which is
    replaced: no model is loaded)."""
    seen = []

    class Recorder:
        def __init__(self, cfg, run_dir: Path, **_: object) -> None:
            seen.append(cfg)
            self.run_dir = run_dir

        def train(self) -> TrainResult:
            return TrainResult(self.run_dir, 0, interrupted=False, checkpoint=None)

    monkeypatch.setattr(train, "Trainer", Recorder)
    result = CliRunner().invoke(app, ["train", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    return config_toml(seen[0])


@pytest.mark.parametrize(("flags", "expected"), PRESETS, ids=["smollm2-135m", "default"])
def test_config_model_prints_the_preset_train_runs(flags, expected, tmp_path, monkeypatch):
    shown = CliRunner().invoke(app, ["config", *flags])
    assert shown.exit_code == 0, shown.output
    values = tomllib.loads(shown.output)
    assert {path: lookup(values, path) for path in expected} == expected
    ran = tomllib.loads(config_of_train(flags, tmp_path, monkeypatch))
    # a run records its schedule horizon (the run's steps); raptb config leaves it unset, so that
    # its output, saved as a --config file, follows --steps
    assert ran.pop("schedule_steps") == ran["steps"] and "schedule_steps" not in values
    assert ran == values


def help_sections(text: str) -> dict[str, list[str]]:
    """Section title -> the options under it (each option's first spelling), in order."""
    sections: dict[str, list[str]] = {}
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line):
            sections[line[:-1]] = current = []
        elif match := re.match(r"  (--?[\w.-]+)", line):
            current.append(match.group(1))
    return sections


# the flags a newcomer uses first, by panel, in order
NEWCOMER_PANELS = [
    ("Run", ["--task", "--steps", "--seed", "--out", "--resume", "--config", "--threads"]),
    ("Model", ["--model", "--lora-rank", "--lr"]),
    ("Objective", ["--loss", "--kappa"]),
    ("Replay", ["--replay"]),
]


def test_train_help_opens_with_the_newcomer_flags_by_panel() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], terminal_width=100)
    assert result.exit_code == 0
    sections = help_sections(result.output)
    assert list(sections.items())[: len(NEWCOMER_PANELS)] == NEWCOMER_PANELS
    # then the rest: the other short flags, every field's --PATH flag, --help
    assert list(sections)[len(NEWCOMER_PANELS) :] == [OTHER_FLAGS_PANEL, FIELDS_PANEL, "Options"]
    assert {"--batch-size", "--overwrite", "--progress"} <= set(sections[OTHER_FLAGS_PANEL])
    assert "--optim.lr" in sections[FIELDS_PANEL] and "--lr" not in sections[FIELDS_PANEL]
    every = [flag for flags in sections.values() for flag in flags]
    assert len(every) == len(set(every))  # each flag once
