"""The ``raptb`` console script's module, kept free of heavy imports.

Worker processes started with ``spawn`` (the reward pool, app.reward.calls) re-import the
main module; importing the command line itself here would cost each worker torch and transformers.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Console-script entry point: the command line of app.cli, imported inside the error
    handler, because building its flags lists the tasks, which loads the plug-ins' entry points:
    a broken plug-in is then one line and exit code 2, like any other user error."""
    from raptb.app.parent_death import die_with_the_launcher

    die_with_the_launcher()  # a rank of raptb launch ends with its node's launcher
    from raptb.app.errors import run_cli

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        run_cli(_command_line)
        return
    try:
        run_cli(_command_line)
        code = 0
    except SystemExit as done:
        code = _exit_code(done)
    _end_rank(code)


def _exit_code(done: SystemExit) -> int:
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


def _end_rank(code: int) -> None:
    """End a launched rank now that its command is over, its files closed and its process
    group left: the interpreter's teardown is skipped. There, gloo's threads sometimes aborted a
    rank whose run had finished (SIGABRT, "terminate called without an active exception", seen
    under load in tests/app/test_fsdp.py), failing the launch; nothing is left to do there."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _command_line() -> None:
    from raptb.app.cli import main as cli_main

    cli_main()
