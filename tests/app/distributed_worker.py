"""Per-process bodies of the multi-process tests (tests/app/test_distributed.py).

Run by ``accelerate launch ... tests/app/distributed_worker.py CASE OUT``; the 1-process reference
of ``equivalence`` is the same function called in the test's own process. Each process writes its
findings to OUT/rank<r>.pt or .json, and the test compares them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from raptb.app.config import build_config
from raptb.app.distributed import DistContext, RankSlice, gather_items
from raptb.app.step import Trajectories, roll_out
from raptb.app.train import Trainer
from raptb.core.replay import ReplayItem, make_buffer

# Equivalence run: one optimizer step of grad_accum micro-batches of BATCH rows (global), no replay
# and no gradient clipping (clipping and AdamW's first step are both blind to a gradient's scale,
# so the gradients themselves are compared as well as the parameters after the step).
BATCH, ACCUM = 8, 2
EQUIVALENCE = {
    "optim.batch_size": BATCH,
    "optim.grad_accum": ACCUM,
    "optim.clip": None,
    "replay.kind": "none",
    "steps": 1,
    "threads": 1,
    "checkpoint_every": 1,
}


def equivalence(out: Path) -> None:
    """Train one step on fixed rollouts (the same BATCH rows per micro-batch on every world size,
    each rank taking its contiguous share); save gradients, parameters and logZ."""
    ctx = DistContext.from_accelerate()
    micro = iter(range(ACCUM))

    def fixed_collect(policy, task, prompt, n, mix, **_) -> Trajectories:
        # the global micro-batch, sampled from a seed that depends only on the micro-batch index
        generator = torch.Generator(device=policy.device).manual_seed(1000 + next(micro))
        full = roll_out(policy, task, prompt, BATCH, 1.0, generator)
        part = slice(ctx.rank * n, (ctx.rank + 1) * n)
        return Trajectories(
            prompt=prompt,
            tokens=full.tokens[part],
            length=full.length[part],
            rows=full.rows[part],
            texts=full.texts[part],
            on_policy=tuple(range(n)),
            stored_u=None,
            temperature=1.0,
            timings=None,
        )

    trainer = Trainer(build_config(overrides=EQUIVALENCE), out / "run", progress=False, dist=ctx)
    named = dict(trainer.policy.model.named_parameters())
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.update({k: p.grad.detach().clone() for k, p in named.items() if p.grad is not None})
        grads["log_z"] = trainer.log_z.grad.detach().clone()
        return step(*args, **kwargs)

    with mock.patch("raptb.app.train.collect", fixed_collect):
        trainer.optimizer.step = recording_step
        trainer.train()
    params = {k: p.detach().clone() for k, p in named.items()}
    params["log_z"] = trainer.log_z.detach().clone()
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
            )
        )
    return items


def buffers(out: Path) -> None:
    """Several refreshes of a SubM and an RP buffer with rank-specific new items (gathered, as in
    the trainer), then split replay draws; save what every rank holds and drew."""
    ctx = DistContext.from_accelerate()
    found = {}
    for kind in ("subm", "rp"):
        options = {"task": "expr24"} if kind == "subm" else {}
        buffer = make_buffer(kind, capacity=12, **options)
        own = np.random.default_rng([ctx.rank, len(kind)])  # differs by rank
        for _ in range(5):
            buffer.add(gather_items(ctx, _items(own, 6)))
        shared = np.random.default_rng(7)  # seeded equally on every rank, like Trainer.rng
        drawn = RankSlice(buffer, ctx).sample(5, shared, "p")
        found[kind] = {
            "stored": [[it.text, it.terminal_u, it.valid] for it in buffer.items("p")],
            "drawn": [it.text for it in drawn],
            "global_draw": [
                it.text for it in buffer.sample(5 * ctx.world_size, np.random.default_rng(7), "p")
            ],
            "rng_after": int(shared.integers(1 << 30)),
        }
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    case, folder = sys.argv[1], Path(sys.argv[2])
    {"equivalence": equivalence, "buffers": buffers}[case](folder)
