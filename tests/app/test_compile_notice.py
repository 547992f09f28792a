"""The first-run line: said before a kernel compiles (cold cache), never when it is loaded (warm).

A throwaway ``cache=True`` kernel in a file of ``tmp_path`` stands for raptb's: the first module
that loads the file compiles it and writes its cache beside it; a second module loading the same
file (a new dispatcher, as a new process would have) finds it in the cache.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.training import train
from raptb.app.training.train import TrainResult
from raptb.app.training.train_progress import COMPILING_LINE, compile_notice

KERNELS = """
import numba

@numba.njit(cache=True)
def twice(x):
    return 2 * x

@numba.njit(cache=True)
def thrice(x):
    return 3 * x
"""
_loads = itertools.count()


def load_kernels(folder: Path, package: str) -> ModuleType:
    """The kernels of ``folder/kernels.py`` (written on first use) as a new module under
    ``package``: new dispatchers, sharing the file's Numba cache with the earlier loads."""
    path = folder / "kernels.py"
    if not path.exists():
        path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location(f"{package}probe_{next(_loads)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def in_tree_cache(monkeypatch) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)


def test_the_line_is_said_once_on_a_cold_cache_and_never_on_a_warm_one(tmp_path: Path) -> None:
    said: list[str] = []
    cold = load_kernels(tmp_path, "probe.")
    with compile_notice(said.append, package="probe."):
        assert said == []  # not before a kernel compiles
        assert cold.twice(4) == 8
        assert cold.thrice(4) == 12  # a second kernel compiling: still one line
    assert said == [COMPILING_LINE]
    assert list(tmp_path.glob("__pycache__/kernels.*.nbi"))  # the cache the next load reads
    said.clear()
    warm = load_kernels(tmp_path, "probe.")
    with compile_notice(said.append, package="probe."):
        assert (warm.twice(5), warm.thrice(5)) == (10, 15)
    assert said == []


def test_kernels_of_other_packages_say_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    theirs = load_kernels(tmp_path, "elsewhere.")
    with compile_notice(said.append, package="probe."):
        assert theirs.twice(2) == 4
    assert said == []


def test_raptb_train_says_the_line_on_stdout_when_its_kernels_compile(
    tmp_path: Path, monkeypatch
) -> None:
    """``raptb train`` with a Trainer whose run calls a kernel of a module under ``raptb.``: the
    line on stdout (stderr keeps to warnings and one-line errors), once, on the cold cache; not on
    the warm one."""
    kernels: list[ModuleType] = []

    class KernelTrainer:
        def __init__(self, cfg, run_dir: Path, **_: object) -> None:
            self.run_dir = run_dir

        def train(self) -> TrainResult:
            assert kernels[-1].twice(3) == 6
            return TrainResult(self.run_dir, 1, interrupted=False, checkpoint=None)

    monkeypatch.setattr(train, "Trainer", KernelTrainer)
    runner = CliRunner()
    stdout = []
    for run in ("cold", "warm"):
        kernels.append(load_kernels(tmp_path, "raptb."))
        args = ["train", "--steps", "1", "--threads", "1", "--out", str(tmp_path / run)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert COMPILING_LINE not in result.stderr
        stdout.append(result.stdout)
    assert stdout[0].splitlines().count(COMPILING_LINE) == 1
    assert COMPILING_LINE not in stdout[1]
