"""The ``raptb`` command line (Typer).

Each command lives in the module that implements its use case; this module only wires them.
"""

from __future__ import annotations

import typer

from raptb.app.bench import subm as bench_subm
from raptb.app.enumerate import enumerate_command
from raptb.app.errors import run_cli
from raptb.app.evaluate import eval_command
from raptb.app.train_command import train_command

app = typer.Typer(
    name="raptb",
    help="Fine-tune language models as GFlowNets (RapTB objective, SubM replay).",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Micro-benchmarks of the hot paths.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
bench_app.command("subm")(bench_subm)
app.command("train")(train_command)
app.command("enumerate")(enumerate_command)
app.command("eval")(eval_command)


def main() -> None:
    """Console-script entry point."""
    # raptb draws its own progress bars; transformers' per-file bars would interleave with them
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run_cli(app)
