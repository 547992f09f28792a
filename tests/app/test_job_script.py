"""docs/guarantees.md's job script for a batch shell that SLURM signals too (``--signal=B:TERM``,
``scancel --full``, the time limit): run with stand-ins for ``srun`` (a step that exits 143 on
SIGTERM, as ``raptb launch`` does after its checkpoint) and ``scontrol``, it requeues the job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "guarantees.md"
STEP = """import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.3), sys.exit(143)))
Path(sys.argv[0]).with_name("started").write_text("")
time.sleep(60)
"""


def job_script(marker: str) -> str:
    """The bash block of docs/guarantees.md that contains ``marker``."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def run_script(script: str, tmp_path: Path, signal_step: bool) -> tuple[int, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\n{STEP}")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    for stub in (srun, scontrol):
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    shell = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (bin_dir / "started").exists():
        assert time.monotonic() < deadline and shell.poll() is None, "the step did not start"
        time.sleep(0.02)
    if signal_step:  # scancel --full: every process of the batch step at once
        os.killpg(shell.pid, signal.SIGTERM)
    else:  # --signal=B:TERM: the batch shell alone
        os.kill(shell.pid, signal.SIGTERM)
    code = shell.wait(timeout=30)
    log = tmp_path / "scontrol.log"
    return code, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("signal_step", [False, True])
def test_a_signalled_batch_shell_still_requeues(tmp_path, signal_step):
    code, requeued = run_script(job_script("trap "), tmp_path, signal_step)
    assert requeued == "requeue 7\n", code
