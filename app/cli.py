"""The ``raptb`` command line (Typer).

Each command lives in the module that implements its use case; this module only wires them.
"""

from __future__ import annotations

import typer

from raptb.app.enumerate import enumerate_command

app = typer.Typer(
    name="raptb",
    help="Fine-tune language models as GFlowNets (RapTB objective, SubM replay).",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Micro-benchmarks of the hot paths.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.command("enumerate")(enumerate_command)


def main() -> None:
    """Console-script entry point."""
    app()
