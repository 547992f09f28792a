"""Two nodes tried on one machine: two ``raptb launch`` processes (``--num_machines 2
--machine_rank 0/1``), one gloo process each, as docs/distributed.md's SLURM script starts them
(one launcher per node). Each node's launcher must end with the run's outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raptb.app.distribution.launch import join_timeout
from raptb.app.run_dir.checkpoint import list_checkpoints
from tests.app.distributed_worker import cli, free_port, run_ranks
from tests.app.test_cluster import ROOT, records, train, wait_for_lines


def node(rank: int, port: int, args: list[str]) -> subprocess.Popen:
    """Node ``rank``'s launcher of a 2-node run of 1 process per node."""
    options = ["--config_file", str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml")]
    options += ["--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank)]
    options += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", "from raptb.app.cli import main; main()", "launch", *options, *args],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def both(tmp_path: Path, run: Path, steps: int = 40, wait: bool = True) -> list[subprocess.Popen]:
    """Both nodes' launchers of ``train --resume`` for ``steps`` steps; ``wait``: until the run
    has logged its first step."""
    port, args = free_port(), train(tmp_path, run, "--steps", str(steps))
    nodes = [node(rank, port, args) for rank in (0, 1)]
    if wait:
        wait_for_lines(run, 1, nodes[0])
    return nodes


def ended(proc: subprocess.Popen) -> tuple[int, list[str]]:
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # the launcher and its ranks (its own session)
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, [line for line in err.splitlines() if line.startswith("error:")]


def test_sigterm_to_one_nodes_launcher_ends_both_nodes_with_143_and_both_resume_exactly(
    tmp_path,
):
    """Node 1's launcher alone gets SIGTERM: it forwards it to its rank, the ranks agree to stop,
    rank 0 (which got no signal) checkpoints, and both launchers exit 143 (the job requeues both
    nodes; before, node 1's said the ranks did not stop in time, exit 2, and node 0's exited 0).
    The requeued job, ``--resume`` on both nodes, ends with the log of an uninterrupted run of
    the same two ranks."""
    ref, run, steps = tmp_path / "ref", tmp_path / "run", 12
    run_ranks(cli, *train(tmp_path, ref, "--steps", str(steps)))  # uninterrupted, 2 ranks
    nodes = both(tmp_path, run, steps)
    os.kill(nodes[1].pid, signal.SIGTERM)
    outcomes = [ended(proc) for proc in nodes]
    assert outcomes == [(143, []), (143, [])], outcomes
    done = len(records(run))
    assert done < steps, "the run ended before the signal; nothing was tested"
    assert [c.name for c in list_checkpoints(run)] == [f"step-{done:06d}"]

    outcomes = [ended(proc) for proc in both(tmp_path, run, steps, wait=False)]
    assert outcomes == [(0, []), (0, [])], outcomes
    assert records(run) == records(ref)


def test_kill_9_of_one_nodes_launcher_stops_its_rank_and_the_run_with_143(tmp_path):
    """kill -9 of node 1's launcher: its rank gets SIGTERM (it dies with its launcher instead of
    training on unwatched), the run checkpoints, and node 0's launcher exits 143 at once (not 0
    after torch's 300 s exit barrier)."""
    run = tmp_path / "run"
    nodes = both(tmp_path, run)
    os.kill(nodes[1].pid, signal.SIGKILL)
    assert ended(nodes[0]) == (143, [])
    done = len(records(run))
    assert done < 40 and [c.name for c in list_checkpoints(run)] == [f"step-{done:06d}"]


def test_a_node_started_alone_ends_after_the_distributed_timeout_with_one_line(tmp_path):
    """Node 1 never starts: node 0's launcher waits ``[distributed] timeout`` for it, then one
    line says so, exit 2, and nothing was written."""
    run = tmp_path / "run"
    args = train(tmp_path, run)
    with (tmp_path / "run.toml").open("a") as config:
        config.write("[distributed]\ntimeout = 5\n")
    started = time.monotonic()
    code, lines = ended(node(0, free_port(), args))
    assert code == 2 and len(lines) == 1, lines
    assert "launchers did not all meet within 5 s" in lines[0] and "machine_rank 0" in lines[0]
    assert time.monotonic() - started < 120
    assert not run.exists()


def test_the_launchers_wait_for_each_other_as_long_as_the_distributed_timeout(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[distributed]\ntimeout = 12.5\n")
    assert join_timeout(["train", "--config", str(config)]) == 13
    assert join_timeout(["train", f"--config={config}"]) == 13
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[distributed]\ntimeout = 7\n")
    assert join_timeout(["train", "--out", str(run), "--resume"]) == 7
    assert join_timeout(["train", "--out", str(run)]) == 600  # a new run: its own defaults
    assert join_timeout(["train", "--config", str(tmp_path / "missing.toml")]) == 600
