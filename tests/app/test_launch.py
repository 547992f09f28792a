"""``raptb launch`` before any process starts: its help, and the refusals that need no rank."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb import __version__
from raptb.app.cli import app
from raptb.app.distribution.launch import OUTCOME_ENV
from raptb.app.parent_death import LAUNCHER_PID_ENV

DEEPSPEED_CONFIG = """
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 2
num_machines: 1
machine_rank: 0
num_processes: 2
mixed_precision: 'no'
use_cpu: false
"""


def test_launch_help_shows_the_commands_help():
    result = CliRunner().invoke(app, ["launch", "--help"])
    assert result.exit_code == 0, result.output
    assert "raptb launch [ACCELERATE LAUNCH OPTIONS] train" in " ".join(result.output.split())
    assert "accelerate launch --help" in result.output


def test_a_deepspeed_config_without_deepspeed_is_one_line_exit_2(tmp_path: Path, monkeypatch):
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("DeepSpeed is installed: the ranks refuse it (test_distributed)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    config = tmp_path / "deepspeed.yaml"
    config.write_text(DEEPSPEED_CONFIG)
    args = ["launch", "--config_file", str(config), "train", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: DeepSpeed is not supported: raptb trains data-parallel or fully sharded "
        "(accelerate configs with distributed_type MULTI_GPU / MULTI_CPU, or FSDP)"
    ]
    assert not (tmp_path / "run").exists()
    # the launcher's variables for its ranks are gone with it: a later run in this process (a
    # test's) must not try to record its outcome into the launch's deleted folder
    assert {OUTCOME_ENV, LAUNCHER_PID_ENV} & set(os.environ) == set()


def test_a_launched_rank_skips_the_teardown_that_could_abort_it():
    """A rank's command is over (files closed, process group left): it ends with the command's
    code and flushed output even when the interpreter's teardown would abort it, as gloo's threads
    sometimes did (stood in for by an exit handler that aborts)."""
    code = "import atexit, os; atexit.register(os.abort); from raptb.app.entry import main; main()"
    env = {**os.environ, "WORLD_SIZE": "2"}
    done = subprocess.run(
        [sys.executable, "-c", code, "--version"], env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"raptb {__version__}\n"), done.stderr


def test_a_ranks_one_line_error_is_left_to_the_launcher(tmp_path: Path, monkeypatch):
    """Under raptb launch every rank leaves its one-line error for the launcher, which prints the
    first failed rank's: a rank other than 0 that fails first gets rank 0 stopped, perhaps before
    rank 0 could print, and the run would end with no line at all."""
    from raptb.app.training.train_command import _fail

    monkeypatch.setenv(OUTCOME_ENV, str(tmp_path / "outcome"))
    monkeypatch.setenv("RANK", "1")
    assert _fail("optim.batch_size 7 does not split evenly").exit_code == 2
    assert (tmp_path / "error-rank1").read_text() == "optim.batch_size 7 does not split evenly"


@pytest.mark.parametrize("ending", ["SignalException", "SystemExit"])
@pytest.mark.parametrize("stopped", [True, False])
def test_a_signalled_launcher_exits_with_what_the_ranks_recorded(monkeypatch, ending, stopped):
    """How the launcher ends once it got SIGTERM and stopped its ranks: torch raises
    SignalException, which accelerate 1.16 turns into exit 128 + 15 whether or not the ranks
    finished stopping. Either way the launch exits with the code the ranks recorded (143: they
    checkpointed), or, when none did (killed first), with one line and exit 2."""
    import accelerate.commands.launch as accelerate_launch
    from torch.distributed.elastic.multiprocessing import SignalException

    from raptb.app.distribution.launch import record_outcome

    def launcher_got_sigterm(args: object) -> None:
        if stopped:
            record_outcome(143)  # what the first local rank does after its checkpoint
        if ending == "SystemExit":
            sys.exit(128 + signal.SIGTERM)
        raise SignalException("got SIGTERM", sigval=signal.SIGTERM)

    monkeypatch.setattr(accelerate_launch, "launch_command", launcher_got_sigterm)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "0")
    result = CliRunner().invoke(app, ["launch", "--num_processes", "2", "train"])
    if stopped:
        assert (result.exit_code, result.stderr) == (143, "")
    else:
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            "error: the processes did not stop within TORCH_ELASTIC_SHUTDOWN_TIMEOUT (0 s) after "
            "SIGTERM; the run's newest checkpoint is intact, continue with --resume"
        ]


def test_another_exit_of_the_launcher_is_its_own(monkeypatch):
    import accelerate.commands.launch as accelerate_launch

    monkeypatch.setattr(accelerate_launch, "launch_command", lambda args: sys.exit(1))
    assert CliRunner().invoke(app, ["launch", "--num_processes", "2", "train"]).exit_code == 1
