"""Per-process bodies of the multi-process tests (tests/app/test_distributed.py).

:func:`run_ranks` forks ``world`` CPU processes with the environment a launcher (torchrun,
``accelerate launch``) gives its workers: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT. Forking
from the test process skips re-importing torch and transformers per rank, which keeps the tests
short on a small machine; the launcher itself is exercised once, by the test of
``accelerate launch -m raptb train``. The 1-process reference of ``equivalence`` is the same
function called with the single-process context. Each process writes its findings to
OUT/rank<r>.pt or .json, and the test compares them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from accelerate import PartialState
from torch.distributed.tensor import DTensor, distribute_tensor

from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import build_config
from raptb.app.distribution.distributed import DistContext
from raptb.app.training.gflownet.mix_schedule import Mix
from raptb.app.training.gflownet.row_plan import plan_rows
from raptb.app.training.micro_batch import combine_micro_batch
from raptb.app.training.step import LossResult, Trajectories, sample_trajectories
from raptb.app.training.step_batch import RowPlan, StepBatch
from raptb.app.training.train import Trainer
from raptb.core.replay import ReplayItem, make_buffer, replay_kwargs


def free_port() -> int:
    """A TCP port nobody listens on now (for a rendezvous; the machine may run other jobs)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, env: dict[str, str], body: Callable[..., Any], args: tuple
) -> None:
    os.environ.update(
        env,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        CUDA_VISIBLE_DEVICES="",
    )
    PartialState._reset_state()  # the fork copied the test process's (single-process) state
    torch.set_num_threads(1)
    try:
        body(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# what ``accelerate launch`` with an FSDP config (fsdp_version 2) puts in its workers' environment
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


def run_ranks(
    body: Callable[..., Any], *args: Any, world: int = 2, env: dict[str, str] | None = None
) -> None:
    """``body(*args)`` on ``world`` forked CPU processes joined by gloo, with the launcher's
    variables plus ``env``; raises when one fails."""
    mp.start_processes(
        _rank_main,
        args=(world, free_port(), env or {}, body, args),
        nprocs=world,
        join=True,
        start_method="fork",
    )


def cli(*args: str, expect: int = 0) -> None:
    """``raptb ARGS`` in this process; AssertionError unless it exits with ``expect``."""
    from raptb.app.cli import main

    sys.argv = ["raptb", *args]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    assert code == expect, f"raptb {' '.join(args)} exited {code}"


# Equivalence run: one optimizer step of grad_accum micro-batches of BATCH rows (global), no replay
# and no gradient clipping (clipping and AdamW's first step are both blind to a gradient's scale,
# so the gradients themselves are compared as well as the parameters after the step).
BATCH, ACCUM = 8, 2
EQUIVALENCE = {
    "optim.batch_size": BATCH,
    "optim.grad_accum": ACCUM,
    "replay.kind": "none",
    "steps": 1,
    "threads": 1,
    "checkpoint_every": 1,
}


ALL_REPLAYED = Mix(
    p_replay=1.0, low_temp_prob=0.0, temp_lo=1.0, temp_hi=1.0, p_oracle=0.0, oracle_fraction=0.0
)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor``, gathered whole when sharded (a collective then)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def equivalence(
    out: Path, ctx: DistContext | None = None, lora: int = 0, checkpointed: bool = False
) -> None:
    """Train one step on fixed rollouts (the same BATCH rows per micro-batch on every world size,
    each rank taking its contiguous share); save gradients, parameters and logZ (whole, when the
    policy is sharded). ``lora``: the LoRA rank (0: full fine-tuning). ``checkpointed``: assert
    that the trained blocks checkpoint their activations (turned on by the launch's settings)."""
    ctx = DistContext.from_accelerate() if ctx is None else ctx

    def fixed_collect() -> StepBatch:
        # the step's global rows, sampled from a seed that depends only on the step
        generator = torch.Generator(device=trainer.policy.device).manual_seed(1000 + trainer.step)
        own, prompts = trainer.step_rows()
        full = sample_trajectories(
            trainer.policy, trainer.task, prompts[0], len(prompts), 1.0, generator
        )
        part = slice(own.start, own.stop)
        piece = Trajectories(
            prompt=prompts[0],
            tokens=full.tokens[part],
            length=full.length[part],
            rows=full.rows[part],
            texts=full.texts[part],
            on_policy=tuple(range(len(own))),
            stored_u=None,
            temperature=1.0,
            timings=None,
        )
        n = len(prompts)
        plan = RowPlan(tuple(prompts), np.zeros(n, dtype=np.int8), np.ones(n), {})
        return StepBatch((piece,), plan, None)

    # no LoRA dropout: its masks are drawn per rank, so the ranks would not share one function
    config = build_config(overrides={**EQUIVALENCE, "lora.rank": lora, "lora.dropout": 0.0})
    # clip None is "not given" as an override, so it is set on the built config
    config = config.model_copy(update={"optim": config.optim.model_copy(update={"clip": None})})
    assert config.optim.clip is None
    trainer = Trainer(config, out / "run", progress=False, dist=ctx)
    blocks = [m for m in trainer.policy.model.modules() if type(m).__name__.endswith("GPT2Block")]
    assert blocks and all(block.gradient_checkpointing == checkpointed for block in blocks)
    named = dict(trainer.policy.model.named_parameters())
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.update({k: _whole(p.grad) for k, p in named.items() if p.grad is not None})
        grads["log_z"] = trainer.algorithm.log_z.grad.detach().clone()
        return step(*args, **kwargs)

    trainer.algorithm._collect = fixed_collect
    trainer.optimizer.step = recording_step
    trainer.train()
    params = {k: _whole(p) for k, p in named.items()}
    params["log_z"] = trainer.algorithm.log_z.detach().clone()
    torch.save({"grads": grads, "params": params}, out / f"rank{ctx.rank}.pt")


def _items(rng: np.random.Generator, count: int) -> list[ReplayItem]:
    """Random Expr24-like items: texts over a small alphabet so SubM's similarities matter."""
    items = []
    for _ in range(count):
        length = int(rng.integers(3, 8))
        tokens = tuple(int(t) for t in rng.integers(0, 6, size=length))
        u = np.concatenate([np.zeros(length), [rng.uniform(0, 1)]])
        items.append(
            ReplayItem(
                prompt="p",
                tokens=tokens,
                text="".join("1234+*"[t] for t in tokens),
                log_r=u,
                u=u,
                valid=bool(rng.random() < 0.7),
                score=float(u[-1]),
            )
        )
    return items


def buffers(out: Path) -> None:
    """Several refreshes of a SubM and an RP buffer with rank-specific new items (gathered, as in
    the trainer), then split replay draws; save what every rank holds and drew."""
    ctx = DistContext.from_accelerate()
    found = {}
    for kind in ("subm", "rp"):
        options = task_spec("expr24").subm if kind == "subm" else {}
        buffer = make_buffer(kind, **replay_kwargs(kind, {**options, "capacity": 12}))
        own = np.random.default_rng([ctx.rank, len(kind)])  # differs by rank
        for _ in range(5):
            # the trainer's path: new items travel with the micro-batch's outcome
            outcome = combine_micro_batch(ctx, LossResult(0.0, {}), [], 0, _items(own, 6))
            buffer.add(outcome.items)
        shared = np.random.default_rng(7)  # seeded equally on every rank, like Trainer.rng
        rows = ["p"] * (5 * ctx.world_size)
        plan = plan_rows(rows, ALL_REPLAYED, buffer=buffer, oracle=None, rng=shared)
        whole = plan_rows(
            rows, ALL_REPLAYED, buffer=buffer, oracle=None, rng=np.random.default_rng(7)
        )
        found[kind] = {
            "stored": [[it.text, it.terminal_u, it.valid] for it in buffer.items("p")],
            "drawn": [plan.items[r].text for r in range(ctx.rank * 5, (ctx.rank + 1) * 5)],
            "global_draw": [whole.items[r].text for r in range(len(rows))],
            "rng_after": int(shared.integers(1 << 30)),
        }
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(found))


def clipping(out: Path) -> None:
    """Random gradients on a sharded tiny model plus an unsharded scalar (logZ's role), clipped by
    ``app.distribution.sharding.clip_grad_norm``; saves the whole clipped gradients and the norm
    returned, and the same random gradients unclipped (identical on every rank: one seed)."""
    from raptb.adapters.lm.models import build_char_tokenizer, build_tiny_model
    from raptb.app.distribution.sharding import ShardingPlan, clip_grad_norm, shard_model

    ctx = DistContext.from_accelerate()
    model = build_tiny_model(build_char_tokenizer(), seed=0)
    scalar = torch.nn.Parameter(torch.zeros(()))
    generator = torch.Generator().manual_seed(11)
    raw = {name: torch.randn(p.shape, generator=generator) for name, p in model.named_parameters()}
    raw["scalar"] = torch.randn((), generator=generator) * 5
    shard_model(model, ShardingPlan(wrap=None, reshard_after_forward=True, offload=False))
    for name, p in model.named_parameters():
        p.grad = distribute_tensor(raw[name], p.device_mesh, p.placements, src_data_rank=None)
    scalar.grad = raw["scalar"].clone()
    norm = clip_grad_norm([*model.parameters(), scalar], 1.5)
    clipped = {name: _whole(p.grad) for name, p in model.named_parameters()}
    clipped["scalar"] = scalar.grad.clone()
    torch.save({"raw": raw, "clipped": clipped, "norm": norm}, out / f"rank{ctx.rank}.pt")


def nonfinite_on_one_rank(out: Path, loss: str) -> None:
    """Two steps of ``loss`` where rank 1's first loss is NaN and rank 0's is not: every rank must
    skip that step together (under FSDP a rank that backpropagated alone would wait forever in
    the reduce-scatter). Writes rank 0's log."""
    ctx = DistContext.from_accelerate()
    overrides = {"loss": loss, "steps": 2, "threads": 1, "optim.batch_size": 4}
    overrides |= {"optim.grad_accum": 1, "checkpoint_every": 10, "replay.kind": "none"}
    if loss == "grpo":
        overrides["rl.num_generations"] = 2
    config = build_config(overrides=overrides)
    trainer = Trainer(config, out / "run", progress=False, dist=ctx)
    calls: list[int] = []
    base = type(trainer.algorithm.objective)

    def poisoned(self: Any, *args: Any, **kwargs: Any) -> Any:
        value, diagnostics = base.__call__(self, *args, **kwargs)
        calls.append(1)
        return (value * float("nan") if ctx.rank == 1 and len(calls) == 1 else value), diagnostics

    # the same objective (its type decides which inputs the trainer prepares), NaN once on rank 1
    values = {
        f.name: getattr(trainer.algorithm.objective, f.name)
        for f in fields(trainer.algorithm.objective)
    }
    trainer.algorithm.objective = type("Poisoned", (base,), {"__call__": poisoned})(**values)
    trainer.train()


def rl_logging(out: Path, loss: str) -> None:
    """Two steps of ``loss`` on this rank, recording each rank's own rollouts (correct texts and
    terminal rewards per step); saves them with the correct texts this rank has seen."""
    ctx = DistContext.from_accelerate()
    overrides = {"loss": loss, "steps": 2, "threads": 1, "optim.batch_size": 8}
    overrides |= {"optim.grad_accum": 2, "checkpoint_every": 10, "replay.kind": "none"}
    overrides |= {"rl.num_generations": 2}
    trainer = Trainer(build_config(overrides=overrides), out / "run", progress=False, dist=ctx)
    own: list[dict[str, Any]] = []
    roll_out_alone = trainer.algorithm._on_policy_rows

    def recording() -> Any:
        rollout = roll_out_alone()
        own.append({"step": trainer.step, "correct": rollout.correct, "rewards": rollout.rewards})
        return rollout

    trainer.algorithm._on_policy_rows = recording
    trainer.train()
    found = {"own": own, "seen": sorted(trainer.correct_seen)}
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(found))
