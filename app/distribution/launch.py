"""``raptb launch``: ``accelerate launch -m raptb`` with raptb's exit codes and one-line errors.

``raptb launch [ACCELERATE LAUNCH OPTIONS] train ...`` runs accelerate's launcher in this process
and turns how it ends into what a job script needs:

- the ranks stopped on SIGTERM and checkpointed: exit 143, whether the SIGTERM reached every
  process (SLURM) or the launcher only (which forwards it); the ranks record the stop in the file
  named by ``OUTCOME_ENV``, since a launcher that was signalled reports only its own signal;
- a rank exited with an error: that rank's exit code (2 for raptb's one-line errors, which the
  rank has printed), without the launcher's traceback;
- a rank was killed, or the ranks did not stop in time after the launcher was signalled: one
  line, exit 2 (continue with ``--resume``).

The launcher waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds for the ranks to stop after it is
signalled, then kills them; unless set, this command sets it to ``SHUTDOWN_TIMEOUT``, so that
the cluster's own kill (e.g. SLURM's, after ``--signal=TERM@120``) bounds a stopping run rather
than the launcher's 30 s.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import typer
from rich.console import Console

OUTCOME_ENV = "RAPTB_LAUNCH_OUTCOME"
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
SHUTDOWN_TIMEOUT = 600
"""Seconds the launcher waits for stopping ranks when ``SHUTDOWN_ENV`` is not set."""
COMMANDS = ("train", "eval")


def record_outcome(code: int) -> None:
    """Record the exit code a launched run chose (rank 0), for :func:`launch_command`."""
    path = os.environ.get(OUTCOME_ENV)
    if path:
        Path(path).write_text(f"{code}\n")


def _recorded(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _split(args: list[str]) -> tuple[list[str], list[str]]:
    """accelerate's options and the raptb command line (from the first command name on)."""
    for i, arg in enumerate(args):
        if arg in COMMANDS:
            return [a for a in args[:i] if a != "--"], args[i:]
    raise typer.BadParameter(f"name the raptb command to launch: one of {', '.join(COMMANDS)}")


def _quiet_launcher() -> None:
    """Silence the launcher's log (RAPTB_DEBUG=1 keeps it): the ranks print raptb's own lines,
    and the launcher would repeat each failure and signal at length."""
    import torch.distributed.run  # noqa: F401  (creates the launcher's loggers)

    if os.environ.get("RAPTB_DEBUG") == "1":
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launch_command(ctx: typer.Context) -> None:
    """Run a raptb command on several processes: raptb launch [ACCELERATE LAUNCH OPTIONS] train
    ... (or eval ...). The exit code is raptb's own (143 after a SIGTERM stop with a checkpoint,
    2 for one-line errors or a killed rank), the launcher's traceback is not shown, and the
    launcher waits up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (default here 600 s) for stopping
    processes."""
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    options, command = _split(list(ctx.args))
    _quiet_launcher()
    os.environ.setdefault(SHUTDOWN_ENV, str(SHUTDOWN_TIMEOUT))
    args = launch_command_parser().parse_args([*options, "-m", "raptb", *command])
    with tempfile.TemporaryDirectory(prefix="raptb-launch-") as folder:
        outcome = Path(folder) / "outcome"
        os.environ[OUTCOME_ENV] = str(outcome)
        try:
            accelerate_launch(args)
        except SignalException as exc:
            code = _recorded(outcome)
            if code is None:  # the ranks were killed before they finished stopping
                Console(stderr=True).print(
                    f"[red]error:[/] the processes did not stop within {SHUTDOWN_ENV} "
                    f"({os.environ[SHUTDOWN_ENV]} s) after {exc.sigval.name}; the run's newest "
                    "checkpoint is intact, continue with --resume",
                    soft_wrap=True,
                )
                code = 2
            raise typer.Exit(code) from None
        except ChildFailedError as exc:
            rank, failure = exc.get_first_failure()
            if failure.exitcode > 0:
                raise typer.Exit(failure.exitcode) from None
            Console(stderr=True).print(
                f"[red]error:[/] rank {rank} (pid {failure.pid}) was killed by "
                f"{failure.signal_name()}; the run's newest checkpoint is intact, continue "
                "with --resume",
                soft_wrap=True,
            )
            raise typer.Exit(2) from None
