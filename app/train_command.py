"""``raptb train``: configuration from a TOML file and/or flags (flags win), then the loop.

Each flag's help text and shown default come from its ``TrainConfig`` field (app.config_reference),
so they are written once, in the configuration.

Exit codes: 0 done (or stopped by a first Ctrl-C, checkpointed), 2 a one-line error in the
user's inputs (app.errors), ``EXIT_TERMINATED`` = 143 (128 + SIGTERM) when SIGTERM stopped the
run after checkpointing (preemption: resume with ``--resume``).
"""

from __future__ import annotations

import signal
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from raptb.adapters.registry import task_names, task_spec
from raptb.app.checkpoint import list_checkpoints, remove_stale_temporaries
from raptb.app.config import ConfigError, TrainConfig, build_config
from raptb.app.config_reference import default_text, field_at
from raptb.app.distributed import (
    DistContext,
    dist_rank,
    launched_world_size,
    leave_process_group,
    per_rank_batch,
)
from raptb.app.launch import record_outcome
from raptb.app.resume import CONFIG_FILE, claim_new_run, resumed_config
from raptb.app.run_lock import RunLocked, run_lock
from raptb.app.train import TrainingError
from raptb.app.trainers import make_trainer

_err = Console(stderr=True)
EXIT_TERMINATED = 128 + signal.SIGTERM


def _warn(line: str) -> None:
    _err.print(f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    """Exit 2 with ``message``, printed once (by rank 0) when several processes share a run."""
    if dist_rank() == 0:
        _err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


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


def _flag(path: str, extra: str = "") -> Any:
    """A ``--flag`` for config field ``path``: its description as help, its default shown."""
    help_text = f"{field_at(path).description}{extra}"
    section = path.split(".")[0]
    if section in task_names():
        help_text += f" ({section} task; its other options go in [{section}] of --config.)"
    shown = default_text(path)
    return typer.Option(help=help_text, show_default=shown if shown is not None else False)


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


def train_command(
    task: Annotated[str | None, _flag("task", _task_choices())] = None,
    loss: Annotated[str | None, _flag("loss")] = None,
    replay: Annotated[str | None, _flag("replay.kind")] = None,
    model: Annotated[str | None, _flag("model")] = None,
    steps: Annotated[int | None, _flag("steps")] = None,
    seed: Annotated[int | None, _flag("seed")] = None,
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
    reward: Annotated[str | None, _flag("custom.reward")] = None,
    lr: Annotated[float | None, _flag("optim.lr")] = None,
    log_z_lr: Annotated[float | None, _flag("optim.log_z_lr")] = None,
    batch_size: Annotated[int | None, _flag("optim.batch_size")] = None,
    grad_accum: Annotated[int | None, _flag("optim.grad_accum")] = None,
    checkpoint_every: Annotated[int | None, _flag("checkpoint_every")] = None,
    threads: Annotated[int | None, _flag("threads")] = None,
    lora_rank: Annotated[int | None, _flag("lora.rank")] = None,
    scaffolds: Annotated[Path | None, _flag("smiles.scaffolds")] = None,
    absorb: Annotated[bool | None, _flag("objective.absorb")] = None,
    subm_weights: Annotated[
        tuple[float, float, float, float] | None, _flag("replay.subm_weights")
    ] = None,
    kappa: Annotated[float | None, _flag("reward.kappa")] = None,
    reward_scale: Annotated[float | None, _flag("reward.reward_scale")] = None,
    prompts: Annotated[str | None, _flag("commongen.prompts")] = None,
    oracle: Annotated[str | None, _flag("amp.oracle")] = None,
    report_to: Annotated[
        list[str] | None, _flag("report_to", " Repeat the flag for several trackers.")
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a GFlowNet sampler, or a PPO/GRPO baseline (defaults: the paper's Expr24 setting,
    embedded tiny model)."""
    overrides = {
        "task": task,
        "loss": loss,
        "replay.kind": replay,
        "model": model,
        "custom.reward": reward,
        "steps": steps,
        "seed": seed,
        "optim.lr": lr,
        "optim.log_z_lr": log_z_lr,
        "optim.batch_size": batch_size,
        "optim.grad_accum": grad_accum,
        "checkpoint_every": checkpoint_every,
        "threads": threads,
        "lora.rank": lora_rank,
        "smiles.scaffolds": scaffolds,
        "objective.absorb": absorb,
        "replay.subm_weights": subm_weights,
        "reward.kappa": kappa,
        "reward.reward_scale": reward_scale,
        "commongen.prompts": prompts,
        "amp.oracle": oracle,
        "report_to": report_to[0] if report_to and len(report_to) == 1 else report_to,
    }
    if resume and overwrite:
        raise _fail("--resume and --overwrite exclude each other")
    if resume:
        if out is None:
            raise _fail("--resume needs --out RUN_DIR")
        if config is None:
            config = out / "config.toml"
            if not config.is_file():
                raise _fail(f"--resume: {config} does not exist")
    try:
        cfg = build_config(config, overrides)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    run_dir = out or Path("runs") / f"{cfg.task}-{cfg.loss}-{cfg.replay.kind}-s{cfg.seed}"
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
            trainer = make_trainer(cfg, run_dir, resume=resume, progress=progress, dist=dist)
            result = trainer.train()
            leave_process_group()
    except (TrainingError, ValueError, RunLocked) as exc:
        raise _fail(str(exc)) from None
    code = EXIT_TERMINATED if result.stop_signal == signal.SIGTERM else 0
    if not dist.is_main:
        raise typer.Exit(code)
    record_outcome(code)
    state = "interrupted" if result.interrupted else "done"
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
