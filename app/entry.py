"""The ``raptb`` console script's module, kept free of heavy imports.

Worker processes started with ``spawn`` (the reward pool, app.reward_calls) re-import the main
module; importing the command line itself here would cost each worker torch and transformers.
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point: the command line of app.cli."""
    from raptb.app.cli import main as cli_main

    cli_main()
