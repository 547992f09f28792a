"""The ``raptb`` console script's module, kept free of heavy imports.

Worker processes started with ``spawn`` (the reward pool, app.training.reward_calls) re-import the
main module; importing the command line itself here would cost each worker torch and transformers.
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point: the command line of app.cli, imported inside the error
    handler, because building its flags lists the tasks, which loads the plug-ins' entry points:
    a broken plug-in is then one line and exit code 2, like any other user error."""
    from raptb.app.errors import run_cli

    run_cli(_command_line)


def _command_line() -> None:
    from raptb.app.cli import main as cli_main

    cli_main()
