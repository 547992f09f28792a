"""``--reward module:function`` resolved as uvicorn resolves ``module:app``: a module beside the
command is found without PYTHONPATH, and a path that does not import is one ``error:`` line with
exit 2 in ``raptb train``, ``raptb eval`` and ``raptb study``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.app.test_crash_safety import run_main

MODULE = "vowels_beside_the_command"
REWARD = "def score(prompt, text):\n    return sum(c in 'aeiou' for c in text) / 5.0\n"
FAST = ["--steps", "1", "--batch-size", "4", "--grad-accum", "1", "--threads", "1"]
STUDY = """
title = "plugin"
seeds = [0]
[base]
task = "custom"
"custom.reward" = "{reward}"
steps = 1
[axes]
loss = ["tb"]
[table]
columns = ["loss"]
metrics = [{{ key = "acc", name = "Acc" }}]
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding the reward module, absent from the import path (as in a
    shell without PYTHONPATH); sys.path and sys.modules are restored afterwards."""
    here = tmp_path / "work"
    here.mkdir()
    (here / f"{MODULE}.py").write_text(REWARD)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(here))])
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.chdir(here)
    yield here
    sys.modules.pop(MODULE, None)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def test_a_reward_beside_the_command_trains_and_evaluates(workdir: Path, capsys) -> None:
    args = ["train", "--task", "custom", "--reward", f"{MODULE}:score", *FAST, "--out", "run"]
    code, err = run_main([*args, "--no-progress"], capsys)
    assert code == 0, err
    code, err = run_main(["eval", "run", "--samples", "8", "--json"], capsys)
    assert code == 0, err
    assert (workdir / "run" / "eval" / "metrics.json").is_file()


def test_a_run_evaluated_where_its_reward_is_not_found_is_a_one_line_error(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run = workdir / "run"
    args = ["train", "--task", "custom", "--reward", f"{MODULE}:score", *FAST, "--out", str(run)]
    assert run_main([*args, "--no-progress"], capsys)[0] == 0
    # another shell, in another directory: the module is neither there nor importable
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(workdir)])
    monkeypatch.delitem(sys.modules, MODULE)
    monkeypatch.chdir(tmp_path)
    code, err = run_main(["eval", str(run), "--samples", "8"], capsys)
    assert code == 2
    assert f"no '{MODULE}' in the current directory ({tmp_path})" in one_error_line(err)


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("no_such_module_here:score", "cannot import module 'no_such_module_here'"),
        (f"{MODULE}:absent", f"module '{MODULE}' has no 'absent'"),
        ("broken_on_import:score", "cannot import module 'broken_on_import': NameError"),
    ],
)
def test_train_and_study_refuse_a_bad_reward_path_in_one_line(
    workdir: Path, capsys, reward: str, message: str
) -> None:
    (workdir / "broken_on_import.py").write_text("undefined_name\n")
    args = ["train", "--task", "custom", "--reward", reward, *FAST, "--no-progress"]
    code, err = run_main(args, capsys)
    assert code == 2 and message in one_error_line(err)
    (workdir / "study.toml").write_text(STUDY.format(reward=reward))
    code, err = run_main(["study", "study.toml", "--no-progress"], capsys)
    assert code == 2 and message in one_error_line(err)
    assert not (workdir / "runs").exists()  # refused before any run started
    sys.modules.pop("broken_on_import", None)
