"""``keep_freed_memory`` through a run: None keeps freed memory on a CPU (adapters.lm.heap), False
leaves malloc alone, and config.toml records what ran, False where glibc's malloc is absent (with
a warning when it was asked for)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from raptb.app.configuration.config import build_config
from raptb.app.training import train
from raptb.app.training.train import Trainer


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: bool | None, available: bool
) -> tuple[list[str], bool, list[str]]:
    calls: list[str] = []
    monkeypatch.setattr(train, "keep_freed_memory", lambda: calls.append("kept") or available)
    warnings: list[str] = []
    monkeypatch.setattr(Trainer, "warn", lambda self, line: warnings.append(line))
    overrides: dict[str, object] = {"steps": 1, "optim.batch_size": 4, "optim.grad_accum": 1}
    if keep is not None:
        overrides["keep_freed_memory"] = keep
    Trainer(build_config(overrides=overrides), tmp_path / "run", progress=False).train()
    recorded = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    return calls, recorded["keep_freed_memory"], warnings


def test_none_keeps_it_on_a_cpu_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(tmp_path, monkeypatch, None, True)[:2] == (["kept"], True)


def test_false_leaves_malloc_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(tmp_path, monkeypatch, False, True)[:2] == ([], False)


def test_without_glibc_it_records_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(tmp_path, monkeypatch, None, False) == (["kept"], False, [])


def test_asked_for_without_glibc_it_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(tmp_path, monkeypatch, True, False) == (
        ["kept"],
        False,
        [
            "keep_freed_memory: this C library is not glibc, whose malloc it sets: the run goes on "
            "without it (keep_freed_memory = false says so)"
        ],
    )
