"""``raptb train``: configuration from a TOML file and/or flags (flags win), then the loop.

Each flag's help text and shown default come from its ``TrainConfig`` field
(app.configuration.reference), so they are written once, in the configuration.

Exit codes: 0 done (or stopped by a first Ctrl-C or by ``--time-limit``, checkpointed), 2 a
one-line error in the user's inputs (app.errors), ``EXIT_TERMINATED`` = 143 (128 + SIGTERM) when
SIGTERM stopped the run after checkpointing (preemption: resume with ``--resume``).
"""

from __future__ import annotations

import inspect
import signal
import tomllib
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from raptb.adapters.tasks.registry import task_names, task_spec
from raptb.app.configuration.config import ConfigError, TrainConfig, build_config
from raptb.app.configuration.reference import config_fields, default_text, field_at
from raptb.app.distribution.launch import hand_to_launcher, record_outcome
from raptb.app.run_dir.checkpoint import list_checkpoints, remove_stale_temporaries
from raptb.app.run_dir.resume import claim_new_run, resumed_config
from raptb.app.run_dir.run_config import CONFIG_FILE
from raptb.app.run_dir.run_lock import RunLocked, run_lock
from raptb.app.training.training_error import TrainingError

_err = Console(stderr=True)
EXIT_TERMINATED = 128 + signal.SIGTERM


def _warn(line: str) -> None:
    _err.print(f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    """Exit 2 with ``message``, printed once when several processes share a run: under
    raptb launch every rank leaves it to the launcher, which prints the first failed rank's (a
    rank that exits first gets the others stopped, perhaps before rank 0 could print); else rank
    0 prints it."""
    from raptb.app.distribution.distributed import dist_rank

    if not hand_to_launcher(message) and dist_rank() == 0:
        _err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def _a_file(run_dir: Path) -> str:
    return f"--out: {run_dir} is a file, not a directory; name a run directory (new or existing)"


def _prepare_run(
    run_dir: Path, cfg: TrainConfig, resume: bool, overwrite: bool
) -> tuple[TrainConfig, bool]:
    """Clear a killed run's temporaries and settle new run or resume (holding the run's lock):
    the configuration to train and whether a checkpoint is to be loaded."""
    remove_stale_temporaries(run_dir)
    if resume and (run_dir / CONFIG_FILE).is_file():
        cfg = resumed_config(run_dir, cfg)
        if not list_checkpoints(run_dir):
            # e.g. preempted before the first checkpoint: the same run from its start
            _warn(f"{run_dir} has no checkpoint yet; training from step 0")
            return cfg, False
        return cfg, True
    return claim_new_run(run_dir, cfg, overwrite=overwrite), False


def _flag(
    path: str, extra: str = "", *names: str, metavar: str | None = None, panel: str | None = None
) -> Any:
    """A ``--flag`` for config field ``path``: its description as help, its default shown, under
    help panel ``panel``; ``names``: the option's spellings (default: from the parameter's name)."""
    help_text = f"{field_at(path).description}{extra}"
    section = path.split(".")[0]
    if section in task_names():
        help_text += f" ({section} task; its other options go in [{section}] of --config.)"
    shown = default_text(path)
    return typer.Option(
        *names,
        help=help_text,
        show_default=shown if shown is not None else False,
        metavar=metavar,
        rich_help_panel=panel,
    )


def kappa_line(cfg: TrainConfig) -> str:
    """The start-up line stating kappa, the weight of the reference prior in log R, and why."""
    kappa, tiny = cfg.reward.kappa, cfg.model == "tiny"
    if kappa > 0:
        why = (
            "the reference model's prior is mixed into the reward, as in the paper"
            if not tiny
            else "the prior of the from-scratch tiny model at initialisation"
        )
    elif tiny:
        why = (
            "the embedded tiny model is trained from scratch, so it has no prior to keep; the "
            "target is R = exp(lambda S) (pretrained models get 1, as in the paper)"
        )
    else:
        why = "no reference prior, against the paper's 1 for pretrained models"
    return f"reward.kappa = {kappa:g}: {why}"


def _task_choices() -> str:
    return " Registered: " + "; ".join(
        f"{name}: {task_spec(name).summary}" if task_spec(name).summary else name
        for name in task_names()
    )


# The hand-picked short flags: parameter, configuration path, type. Every field also has a
# generated ``--PATH`` flag (below), so each flag is declared once, from its field.
SHORT_FLAGS: tuple[tuple[str, str, Any], ...] = (
    ("task", "task", str),
    ("loss", "loss", str),
    ("replay", "replay.kind", str),
    ("model", "model", str),
    ("steps", "steps", int),
    ("seed", "seed", int),
    ("reward", "custom.reward", str),
    ("lr", "optim.lr", float),
    ("log_z_lr", "optim.log_z_lr", float),
    ("batch_size", "optim.batch_size", int),
    ("grad_accum", "optim.grad_accum", int),
    ("checkpoint_every", "checkpoint_every", int),
    ("threads", "threads", int),
    ("time_limit", "time_limit", float),
    ("lora_rank", "lora.rank", int),
    ("scaffolds", "smiles.scaffolds", Path),
    ("absorb", "objective.absorb", bool),
    ("subm_weights", "replay.subm_weights", tuple[float, float, float, float]),
    ("kappa", "reward.kappa", float),
    ("reward_scale", "reward.reward_scale", float),
    ("prompts", "commongen.prompts", str),
    ("oracle", "amp.oracle", str),
    ("report_to", "report_to", list[str]),
)
_SHORT_HELP = {"report_to": " Repeat the flag for several trackers."}
# ``raptb train --help`` opens with the flags a newcomer uses first, by panel and in this order
# (parameter names: short flags and train_command's own); then the other short flags, then one
# flag per configuration field
FIRST_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Run", ("task", "steps", "seed", "out", "resume", "config", "threads")),
    ("Model", ("model", "lora_rank", "lr")),
    ("Objective", ("loss", "kappa")),
    ("Replay", ("replay",)),
)
OTHER_FLAGS_PANEL = "Other flags"
FIELDS_PANEL = "Every configuration field (--PATH VALUE, as in a --config file)"
_PANEL_OF = {name: panel for panel, names in FIRST_PANELS for name in names}
_FIELD_PREFIX = "field__"
"""Parameter names of the generated flags: ``--optim.lr`` is ``field__optim__lr``."""


def _field_parameter(path: str) -> str:
    return _FIELD_PREFIX + path.replace(".", "__")


def _short_parameter(name: str, path: str, kind: Any) -> inspect.Parameter:
    extra = _task_choices() if name == "task" else _SHORT_HELP.get(name, "")
    panel = _PANEL_OF.get(name, OTHER_FLAGS_PANEL)
    annotation = Annotated[kind | None, _flag(path, extra, panel=panel)]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def _field_parameters() -> list[inspect.Parameter]:
    """A ``--PATH VALUE`` flag for every configuration field that no short flag of the same
    spelling covers (``--steps`` is the short flag; ``--optim.lr`` exists beside ``--lr``)."""
    taken = {name for name, _, _ in SHORT_FLAGS}
    params = []
    for path, _ in config_fields():
        if path in taken:
            continue
        option = _flag(path, "", f"--{path}", metavar="TOML", panel=FIELDS_PANEL)
        params.append(
            inspect.Parameter(
                _field_parameter(path),
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[str | None, option],
            )
        )
    return params


def _toml_value(text: str) -> Any:
    """A flag's text as a TOML value (``1e-3``, ``true``, ``[7, 3]``); otherwise the text."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def flag_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Configuration overrides (dotted path -> value) from the flags given; a field given by its
    short flag and by its ``--PATH`` flag is a ConfigError."""
    overrides: dict[str, Any] = {}
    for name, path, _ in SHORT_FLAGS:
        value = params.get(name)
        if name == "report_to" and value is not None and len(value) == 1:
            value = value[0]
        overrides[path] = value
    for path, _ in config_fields():
        text = params.get(_field_parameter(path))
        if text is None:
            continue
        if overrides.get(path) is not None:
            raise ConfigError(f"invalid config: {path}: given twice (--{path} and a short flag)")
        overrides[path] = _toml_value(text)
    return overrides


def train_command(
    out: Annotated[
        Path | None,
        typer.Option(help="Run directory. (default: runs/<task>-<loss>-<replay>-s<seed>)"),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file with any TrainConfig field.")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the run in --out from its latest checkpoint.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Delete what --out holds and start a new run there.")
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    **flags: Any,
) -> None:
    """Train a GFlowNet sampler, or a PPO/GRPO baseline (defaults: the paper's Expr24 setting,
    embedded tiny model). Every configuration field has a flag --PATH VALUE (--optim.lr 3e-3,
    --objective.k_min "[7, 3]"); flags win over --config."""
    try:
        overrides = flag_overrides(flags)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    recorded: Path | None = None  # the run's own config.toml, when --resume reads it
    if resume and overwrite:
        raise _fail("--resume and --overwrite exclude each other")
    if out is not None and out.exists() and not out.is_dir():
        raise _fail(_a_file(out))
    if resume:
        if out is None:
            raise _fail("--resume needs --out RUN_DIR")
        if config is None:
            config = recorded = out / "config.toml"
            if not config.is_file():
                raise _fail(
                    f"--resume: {out} holds no run to continue ({config} does not exist); drop "
                    "--resume to start a new run there"
                )
    try:
        # the run's own config.toml read as its record (keys removed since are dropped)
        cfg = build_config(config, overrides, recorded=recorded is not None and config is recorded)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    run_dir = out or Path("runs") / f"{cfg.task}-{cfg.loss}-{cfg.replay.kind}-s{cfg.seed}"
    if run_dir.exists() and not run_dir.is_dir():
        raise _fail(_a_file(run_dir))
    # what the command runs (torch, the model) is imported now, not when the command line is
    # built: ``raptb --help`` stays light
    from raptb.app.distribution.distributed import (
        DistContext,
        launched_world_size,
        leave_process_group,
        per_rank_batch,
    )
    from raptb.app.training.train import Trainer
    from raptb.app.training.train_progress import compile_notice

    try:
        # refused before the process group starts: every rank exits at once with one line
        per_rank_batch(cfg.optim.batch_size, launched_world_size())
        dist = DistContext.from_accelerate(cfg.distributed.timeout)
        with ExitStack() as held:

            def prepare() -> tuple[dict[str, Any], bool]:
                held.enter_context(run_lock(run_dir, _warn))
                prepared, again = _prepare_run(run_dir, cfg, resume, overwrite)
                return prepared.model_dump(), again  # plain values travel between processes

            # rank 0 alone holds the lock and prepares the run directory; the others wait for
            # it and share its outcome (a refusal included)
            settled, resume = dist.on_main(prepare)
            cfg = type(cfg).model_validate(settled)
            if dist.is_main:
                typer.echo(kappa_line(cfg))  # stdout: stderr carries warnings and one-line errors
                held.enter_context(compile_notice(typer.echo))  # stdout, as the line above
            trainer = Trainer(cfg, run_dir, resume=resume, progress=progress, dist=dist)
            result = trainer.train()
            leave_process_group()
    except (TrainingError, ValueError, RunLocked) as exc:
        raise _fail(str(exc)) from None
    code = EXIT_TERMINATED if result.stop_signal == signal.SIGTERM else 0
    if code == EXIT_TERMINATED:
        # the run is over and checkpointed: a repeat of the preemption's SIGTERM during the
        # interpreter's shutdown (which puts Python's handlers back to the default action, and
        # takes a second with torch loaded) must not turn exit 143 into a death by the signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if dist.local_rank == 0:  # for this node's launcher (each node of a run has its own)
        record_outcome(code)
    if not dist.is_main:
        raise typer.Exit(code)
    state = "done"
    if result.stop_reason == "time limit":
        state = f"stopped at the time limit ({cfg.time_limit:g} min)"
    elif result.interrupted:
        state = "interrupted"
    _err.print(f"{state}: {result.step}/{cfg.steps} steps; run directory {result.run_dir}")
    if result.interrupted:
        again = f"train --resume --out {result.run_dir}"
        if dist.world_size > 1:
            again = (
                f"raptb launch [the same accelerate options] {again} (or accelerate launch "
                f"[the same options] -m raptb {again})"
            )
        else:
            again = f"raptb {again}"
        _err.print(f"continue with: {again}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _signature() -> inspect.Signature:
    """train_command's parameters as Typer reads them, each with its help panel: the flags of
    ``FIRST_PANELS`` in their order, the other short flags and fixed ones, then one flag per
    configuration field."""
    fixed = [
        p
        for p in inspect.signature(train_command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    fixed = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed]
    for p in fixed:
        p.annotation.__metadata__[0].rich_help_panel = _PANEL_OF.get(p.name, OTHER_FLAGS_PANEL)
    short = [_short_parameter(name, path, kind) for name, path, kind in SHORT_FLAGS]
    first = [name for _, names in FIRST_PANELS for name in names]
    params = sorted(  # a stable sort: the others keep their order
        [*short, *fixed],
        key=lambda p: first.index(p.name) if p.name in first else len(first),
    )
    return inspect.Signature([*params, *_field_parameters()])


train_command.__signature__ = _signature()  # type: ignore[attr-defined]
train_command.__annotations__ = {
    p.name: p.annotation
    for p in train_command.__signature__.parameters.values()  # type: ignore[attr-defined]
}
