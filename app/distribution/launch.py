"""``raptb launch``: ``accelerate launch -m raptb`` with raptb's exit codes and one-line errors.

``raptb launch [ACCELERATE LAUNCH OPTIONS] train ...`` runs accelerate's launcher in this process
and turns how it ends into what a job script needs:

- the ranks stopped on SIGTERM and checkpointed: exit 143, whether the SIGTERM reached every
  process (SLURM) or the launcher only (which forwards it); each node's first local rank records
  the run's exit code in the file named by ``OUTCOME_ENV`` (its own launcher's: on several nodes
  each launcher has one), since a launcher that was signalled reports only its own signal;
- a rank exited with an error: that rank's exit code (2 for raptb's one-line errors, which the
  rank has printed), without the launcher's traceback;
- a rank was killed, or the ranks did not stop in time after the launcher was signalled: one
  line, exit 2 (continue with ``--resume``). A rank that finds a peer gone hands its line to the
  launcher (:func:`hand_to_launcher`) instead of printing it, so that the run ends with one line:
  the killed rank's, or else the failed rank's own.

The launcher waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds for the ranks to stop after it is
signalled, then kills them; unless set, this command sets it to ``SHUTDOWN_TIMEOUT``, so that
the cluster's own kill (e.g. SLURM's, after ``--signal=TERM@120``) bounds a stopping run rather
than the launcher's 30 s.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

from raptb.app.distribution.peer_failure import PEER_GONE
from raptb.app.parent_death import LAUNCHER_PID_ENV

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

OUTCOME_ENV = "RAPTB_LAUNCH_OUTCOME"
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
SHUTDOWN_TIMEOUT = 600
"""Seconds the launcher waits for stopping ranks when ``SHUTDOWN_ENV`` is not set."""
COMMANDS = ("train", "eval")


def record_outcome(code: int) -> None:
    """Record the exit code a launched run chose (each node's local rank 0), for
    :func:`launch_command`."""
    path = os.environ.get(OUTCOME_ENV)
    if path:
        Path(path).write_text(f"{code}\n")


def hand_to_launcher(line: str) -> bool:
    """Under ``raptb launch``, leave this rank's one-line error for the launcher to print (one
    line for the whole run); False elsewhere (the caller prints it)."""
    path, rank = os.environ.get(OUTCOME_ENV), os.environ.get("RANK")
    if not path or rank is None:
        return False
    try:
        _handed(Path(path), int(rank)).write_text(line)
    except (OSError, ValueError):
        return False
    return True


def _handed(outcome: Path, rank: int | str) -> Path:
    """Where rank ``rank`` leaves its line, beside the outcome file ("*": any rank's)."""
    return outcome.with_name(f"error-rank{rank}")


def _recorded(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split("\n", 1)[0].split()) or type(exc).__name__


def _error(line: str) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[red]error:[/] {escape(line)}", soft_wrap=True)


def _split(args: list[str]) -> tuple[list[str], list[str]]:
    """accelerate's options and the raptb command line (from the first command name on)."""
    for i, arg in enumerate(args):
        if arg in COMMANDS:
            return [a for a in args[:i] if a != "--"], args[i:]
    raise typer.BadParameter(f"name the raptb command to launch: one of {', '.join(COMMANDS)}")


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name`` in ``args`` (``--name VALUE`` or ``--name=VALUE``), if given."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    return None


def join_timeout(command: list[str]) -> int:
    """Seconds the launchers of a multi-node run wait for each other: the command's
    ``[distributed] timeout`` (its ``--config`` file, else RUN_DIR/config.toml under ``--resume``),
    else that setting's default. An unreadable file gives the default (the command then reports
    it)."""
    from raptb.app.distribution.distributed import DEFAULT_TIMEOUT

    config, out = _option(command, "--config"), _option(command, "--out")
    if config is None and out is not None and "--resume" in command:
        config = str(Path(out) / "config.toml")
    try:
        timeout = tomllib.loads(Path(config).read_text())["distributed"]["timeout"]
    except (TypeError, OSError, KeyError, tomllib.TOMLDecodeError):
        timeout = DEFAULT_TIMEOUT
    return max(1, math.ceil(float(timeout)))


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
    processes. The options are accelerate launch's (accelerate launch --help lists them); raptb
    launch ... train --help shows train's."""
    if not any(arg in COMMANDS for arg in ctx.args) and {"--help", "-h"} & set(ctx.args):
        typer.echo(ctx.get_help())
        raise typer.Exit()
    options, command = _split(list(ctx.args))
    _quiet_launcher()
    # what the ranks read from the launcher's environment, for this launch only (the command
    # also runs inside another process, e.g. a test's: a later run there must not find it)
    saved = {name: os.environ.get(name) for name in (SHUTDOWN_ENV, LAUNCHER_PID_ENV, OUTCOME_ENV)}
    try:
        _launch(options, command)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def failed_rank(
    exc: ChildFailedError, line_of: Callable[[int], str | None]
) -> tuple[int, ProcessFailure]:
    """The rank to name for a ``ChildFailedError`` and its ``ProcessFailure``: torch's first
    failure (the launcher stops the others after it), unless that rank exited by itself saying a
    peer's connection closed (``line_of(rank)``, its line) while a rank was killed by a signal in
    the same moment: torch dates the peer's error file earlier than the kill it observes, but the
    killed rank is the cause."""
    rank, failure = exc.get_first_failure()
    killed = sorted((r, f) for r, f in exc.failures.items() if f.exitcode < 0)
    if failure.exitcode > 0 and killed and PEER_GONE in (line_of(rank) or ""):
        return killed[0]
    return rank, failure


def _signal_of(code: object) -> signal.Signals | None:
    """The signal an exit code 128 + N stands for (None for any other code)."""
    if not isinstance(code, int) or code <= 128:
        return None
    try:
        return signal.Signals(code - 128)
    except ValueError:
        return None


def _signalled(outcome: Path, signum: signal.Signals) -> NoReturn:
    """End the launch after the launcher got ``signum`` and stopped the ranks: the code the ranks
    recorded (143 when they stopped and checkpointed), else one line and exit 2 (they were killed
    before they finished stopping)."""
    code = _recorded(outcome)
    if code is None:
        handed = sorted(outcome.parent.glob(_handed(outcome, "*").name))
        _error(
            _read(handed[0]) or ""
            if handed  # a rank found a peer gone (e.g. another node's)
            else f"the processes did not stop within {SHUTDOWN_ENV} "
            f"({os.environ[SHUTDOWN_ENV]} s) after {signum.name}; the run's newest "
            "checkpoint is intact, continue with --resume"
        )
        code = 2
    raise typer.Exit(code) from None


def _launch(options: list[str], command: list[str]) -> None:
    """launch_command's body, with its environment restored by the caller."""
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from raptb.app.distribution.distributed import DEEPSPEED_REFUSED

    os.environ.setdefault(SHUTDOWN_ENV, str(SHUTDOWN_TIMEOUT))
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks end with this process
    timeout = join_timeout(command)
    if _option(options, "--rdzv_conf") is None:  # how long the nodes' launchers wait for each other
        options += ["--rdzv_conf", f"timeout={timeout}"]
    args = launch_command_parser().parse_args([*options, "-m", "raptb", *command])
    with tempfile.TemporaryDirectory(prefix="raptb-launch-") as folder:
        outcome = Path(folder) / "outcome"
        os.environ[OUTCOME_ENV] = str(outcome)
        try:
            accelerate_launch(args)
        except ImportError as exc:
            if "deepspeed" not in str(exc).lower():
                raise
            _error(DEEPSPEED_REFUSED)  # accelerate's DeepSpeed launcher, without DeepSpeed
            raise typer.Exit(2) from None
        except (DistError, RendezvousError) as exc:  # the launchers' own meeting, before any rank
            _error(
                f"the {args.num_machines} nodes' launchers did not all meet within {timeout} s "
                f"at {args.main_process_ip}:{args.main_process_port} (this is machine_rank "
                f"{args.machine_rank}; {_first_line(exc)}); start raptb launch on every node "
                "with the same --main_process_ip and --main_process_port, or raise [distributed] "
                "timeout; no process was started"
            )
            raise typer.Exit(2) from None
        except SignalException as exc:
            _signalled(outcome, exc.sigval)
        except SystemExit as exc:
            # accelerate (1.16 here) ends its launcher's SignalException as exit 128 + signal,
            # whether the ranks finished stopping or were killed: the outcome file tells
            signum = _signal_of(exc.code)
            if signum is None:
                raise
            _signalled(outcome, signum)
        except ChildFailedError as exc:
            rank, failure = failed_rank(exc, lambda r: _read(_handed(outcome, r)))
            if failure.exitcode > 0:
                line = _read(_handed(outcome, rank))
                if line:
                    _error(line)
                raise typer.Exit(failure.exitcode) from None
            _error(
                f"rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()}; the "
                "run's newest checkpoint is intact, continue with --resume"
            )
            raise typer.Exit(2) from None
