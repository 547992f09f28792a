"""The ``raptb`` command line (Typer).

Each command lives in the module that implements its use case; this module only wires them.
Help texts are plain text (no rich markup), so that brackets such as ``[custom]`` print as
written. Typer draws an option's ``rich_help_panel`` only with rich formatting: ``raptb train``
(``PanelledCommand``) groups its options under their panels in plain text.
"""

from __future__ import annotations

from typing import Annotated

import click
import typer
from typer.core import TyperCommand

from raptb import __version__
from raptb.app.configuration.reference import config_command
from raptb.app.distribution.launch import launch_command
from raptb.app.errors import run_cli
from raptb.app.evaluation.bench import subm as bench_subm
from raptb.app.evaluation.enumerate import enumerate_command
from raptb.app.evaluation.eval_command import eval_command
from raptb.app.study.command import study_command
from raptb.app.training.train_command import train_command


class PanelledCommand(TyperCommand):
    """A Typer command whose plain-text help lists its options under their ``rich_help_panel``
    titles: the panels in the order of their first option, the options in their declared order
    (one without a panel under ``Options``)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                panels.setdefault(panel, []).append(record)
        for panel, records in panels.items():
            with formatter.section(panel):
                formatter.write_dl(records)


app = typer.Typer(
    name="raptb",
    help="Fine-tune language models as GFlowNets (RapTB objective, SubM replay).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(
    help="Micro-benchmarks of the hot paths.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(bench_app, name="bench")
bench_app.command("subm")(bench_subm)
app.command("train", cls=PanelledCommand)(train_command)
app.command("enumerate")(enumerate_command)
app.command("eval")(eval_command)
app.command("study")(study_command)
app.command("config")(config_command)
app.command(
    "launch",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)(launch_command)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"raptb {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Fine-tune language models as GFlowNets (RapTB objective, SubM replay)."""


def main() -> None:
    """Console-script entry point."""
    # raptb draws its own progress bars; transformers' per-file bars would interleave with them
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run_cli(app)
