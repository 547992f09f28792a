"""The command line starts without the libraries its commands run.

``raptb --help`` and every command's ``--help`` build the options from light modules; torch,
transformers, matplotlib, scipy.stats, ONNX Runtime and peft are imported when a command runs.
Measured on 2 cores (2026-11-29): importing ``raptb.app.cli`` took 8.6 s with them and 0.9 s
without, and ``raptb --help`` 10 s against 2.4 s. A module reached from ``raptb.app.cli`` that
imports one of them at its top fails this test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "matplotlib", "scipy.stats", "onnxruntime", "peft")


def test_the_command_line_imports_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    code = f"import sys, raptb.app.cli; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    # from another folder: the repository root would shadow the installed package's mapping
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert done.stdout.split() == []
