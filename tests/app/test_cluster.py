"""The guarantees under a launcher: ``raptb launch`` on 2 CPU processes (gloo), signalled the way
a cluster signals a job (SLURM: every process of the step; a shell or scheduler: the launcher)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed import DistBackendError

from raptb.app.errors import describe
from raptb.app.run_dir.checkpoint import list_checkpoints
from tests.app.distributed_worker import cli, free_port, run_ranks
from tests.app.flaky_rewards import HOLD_ENV

ROOT = Path(__file__).resolve().parents[2]
RUN_TOML = """
task = "custom"
replay = { kind = "rp" }
optim = { batch_size = 4, grad_accum = 1 }
checkpoint_every = 100
threads = 1
steps = 6
custom = { reward = "tests.app.flaky_rewards:slow" }
"""


def train(tmp_path: Path, run: Path, *flags: str) -> list[str]:
    """The SLURM line of docs/guarantees.md: ``train --config run.toml --out RUN --resume``."""
    config = tmp_path / "run.toml"
    config.write_text(RUN_TOML)
    return [
        "train",
        "--config",
        str(config),
        "--out",
        str(run),
        "--resume",
        "--no-progress",
        *flags,
    ]


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``raptb launch`` with docs/distributed.md's 2-CPU-process config and ``args``, in its own
    process group."""
    options = ["--config_file", str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml")]
    options += ["--main_process_port", str(free_port())]
    code = "from raptb.app.cli import main; main()"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-c", code, "launch", *options, *args],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def records(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def wait_for_lines(run: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    log = run / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and log.read_text().count("\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} log lines (exit {proc.poll()}): {proc.stderr.read()}")


def ranks_of(launcher: int) -> list[int]:
    """The launcher's child processes (the ranks; each in its own session)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return [int(pid) for pid in children]


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def test_sigterm_to_every_process_checkpoints_exits_143_and_resumes_exactly(tmp_path):
    """The SLURM pattern of docs/guarantees.md: SIGTERM reaches the launcher and every rank at
    once (and the launcher forwards its own a moment later)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    run_ranks(cli, *train(tmp_path, ref))  # uninterrupted, in forked ranks (faster to start)

    proc = launch(*train(tmp_path, run))
    wait_for_lines(run, 1, proc)
    for pid in [proc.pid, *ranks_of(proc.pid)]:
        os.kill(pid, signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143, err
    assert "Traceback" not in err and "W1" not in err, err  # nor the launcher's log
    done = len(records(run))
    assert done < 6, "the run ended before the signal; nothing was tested"
    assert [c.name for c in list_checkpoints(run)] == [f"step-{done:06d}"]
    assert not (run / ".lock.pid").exists()
    assert "continue with: raptb launch [the same accelerate options] train --resume" in err

    code, err = finish(launch(*train(tmp_path, run)))
    assert code == 0, err
    assert records(run) == records(ref)


def wait_until_held(hold: Path, ranks: list[int], proc: subprocess.Popen) -> None:
    """Until a rank is inside a reward call that ``flaky_rewards.held`` holds (the others then
    wait for it in the step's collectives)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if any((hold / f"held-{pid}").exists() for pid in ranks):
            return
        time.sleep(0.02)
    raise AssertionError(f"no rank held (exit {proc.poll()}): {proc.stderr.read()}")


@pytest.mark.parametrize(("limit", "expected"), [(None, 143), ("0", 2)])
def test_sigterm_to_the_launcher_only_waits_as_long_as_the_shutdown_limit(
    tmp_path, limit, expected
):
    """A shell's ``kill`` or a scheduler that signals the launcher alone: it forwards SIGTERM and
    waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds for the ranks before killing them. The signal
    comes while the ranks are inside a step (a rank's reward holds it until the test releases
    it), so nothing here depends on the machine's speed. Under raptb launch's default (600 s, not
    torch's 30) the released ranks finish the step, checkpoint, and the launch exits 143; with a
    limit of 0 s the ranks, still held, are killed: one line, exit 2, no checkpoint."""
    run, hold = tmp_path / "run", tmp_path / "hold"
    hold.mkdir()
    env = {HOLD_ENV: str(hold)}
    if limit is not None:
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = limit
    reward = "tests.app.flaky_rewards:held"
    proc = launch(*train(tmp_path, run, "--steps", "50", "--custom.reward", reward), env=env)
    wait_for_lines(run, 1, proc)
    ranks = ranks_of(proc.pid)
    # the limit the launcher was started with, as its ranks inherited it
    for pid in ranks:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={limit or 600}".encode() in environ
    (hold / "hold").touch()
    wait_until_held(hold, ranks, proc)  # the ranks are inside a step
    os.kill(proc.pid, signal.SIGTERM)
    if expected == 143:
        (hold / "hold").unlink()
        (hold / "release").touch()
    code, err = finish(proc)
    assert code == expected, err
    assert "Traceback" not in err, err
    done = len(records(run))
    stopped = [f"step-{done:06d}"] if expected == 143 else []
    assert [c.name for c in list_checkpoints(run)] == stopped
    if expected == 2:
        assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
        assert "did not stop within TORCH_ELASTIC_SHUTDOWN_TIMEOUT (0 s)" in err, err


def rank_pid(launcher: int, rank: int) -> int:
    for pid in ranks_of(launcher):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no rank {rank} under {launcher}")


def test_a_stopped_rank_ends_the_run_with_one_line_naming_it(tmp_path):
    """SIGSTOP of rank 1 (a hung process): rank 0's next collective gives up after
    distributed.timeout, with one line naming rank 1, and the launch exits 2."""
    run = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(RUN_TOML + "[distributed]\ntimeout = 3\n")
    args = ["train", "--config", str(config), "--out", str(run), "--steps", "50", "--no-progress"]
    proc = launch(*args, env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"})
    wait_for_lines(run, 1, proc)
    stopped = rank_pid(proc.pid, 1)
    os.kill(stopped, signal.SIGSTOP)
    started = time.monotonic()
    try:
        code, err = finish(proc)
    finally:
        if Path(f"/proc/{stopped}").exists():
            os.kill(stopped, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1 and "rank 1 did not answer within distributed.timeout" in lines[0], err
    assert "Traceback" not in err, err
    assert time.monotonic() - started < 120  # timeout 3 s, then the launcher's 2 s


def test_a_killed_rank_ends_the_launch_with_one_line_naming_it(tmp_path):
    """kill -9 of rank 1: rank 0 finds its peer gone and leaves its line to the launcher, which
    prints one line naming the killed rank (not rank 0's as well), exit 2."""
    run = tmp_path / "run"
    proc = launch(*train(tmp_path, run, "--steps", "50"))
    wait_for_lines(run, 1, proc)
    killed = rank_pid(proc.pid, 1)
    os.kill(killed, signal.SIGKILL)
    code, err = finish(proc)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert lines == [
        f"error: rank 1 (pid {killed}) was killed by SIGKILL; the run's newest checkpoint is "
        "intact, continue with --resume"
    ], err


def test_a_batch_that_does_not_split_is_one_line_before_the_process_group(tmp_path):
    args = ["train", "--batch-size", "7", "--steps", "1", "--out", str(tmp_path / "run")]
    code, err = finish(launch(*args))
    assert code == 2, err
    assert err.strip().splitlines() == [
        "error: optim.batch_size 7 does not split evenly over 2 processes; use a multiple of 2 "
        "(it is the global micro-batch, summed over ranks)"
    ]
    assert not (tmp_path / "run").exists()  # refused before the run lock, let alone the group


def test_a_dead_peer_in_a_collective_is_a_peer_failure_not_an_internal_error():
    """A collective outside raptb's watched ones (e.g. FSDP's all-gather) fails when a peer
    dies: exit 2 and what to do, not "internal error ... report it"."""
    code, line = describe(DistBackendError("[gloo] Connection closed by peer [127.0.0.1]:1234"))
    assert code == 2 and line.startswith("a peer process died or stopped answering"), line
    assert "continue with --resume" in line


def test_the_launcher_names_the_killed_rank_when_a_peer_exits_in_the_same_moment(tmp_path):
    """torch's first failure is the one with the earlier time; a peer that found the killed rank
    gone wrote its error file before the launcher saw the kill, so torch names the peer. The
    launcher names the killed rank, the cause, when the peer's line says its connection closed;
    otherwise (a peer that timed out on a stopped rank, a rank's own error, the launcher's
    SIGTERM to the others after it) torch's first failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from raptb.app.distribution.launch import failed_rank
    from raptb.app.distribution.peer_failure import PEER_GONE

    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "peer gone", "extraInfo": {
        "py_callstack": "", "timestamp": "1"}}}))  # fmt: skip
    peer = ProcessFailure(local_rank=0, pid=100, exitcode=2, error_file=str(error_file))
    killed = ProcessFailure(local_rank=1, pid=101, exitcode=-9, error_file=str(tmp_path / "none"))
    both = ChildFailedError("raptb", {0: peer, 1: killed})
    assert both.get_first_failure()[0] == 0  # torch's choice: the peer, dated 1 s after the epoch
    gone = {0: f"rank 1 {PEER_GONE} (seen by rank 0 at collective 7): ..."}
    assert failed_rank(both, gone.get) == (1, killed)
    for line in ("rank 1 did not answer within distributed.timeout ...", "optim.batch_size ..."):
        assert failed_rank(both, {0: line}.get) == (0, peer)
    assert failed_rank(ChildFailedError("raptb", {0: peer}), gone.get) == (0, peer)
