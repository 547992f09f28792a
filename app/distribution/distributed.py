"""Data-parallel training across processes started by ``accelerate launch`` (or torchrun).

Every rank runs the whole trainer on its share of each step's rows; the rules that keep the ranks
one training run:

- Batch: ``optim.batch_size`` is the *global* micro-batch (trajectories per micro-batch summed
  over ranks), so a config means the same training on any number of processes. Each rank takes
  batch_size / world rows; a batch that does not split evenly is refused. The global batch of an
  optimizer step is batch_size x grad_accum (= per-rank micro-batch x grad_accum x world): its
  rows are planned on every rank alike (app.training.step_batch), and each rank rolls out and
  trains on its contiguous share of them.
- Seeds: initialisation (model, LoRA, logZ, the numpy RNG of the behaviour mix and replay draws)
  uses ``seed`` on every rank, so all ranks start equal and take the same mix decisions. Rollouts
  and dropout use :func:`sampling_seed`: ``seed`` on rank 0 (a 1-process launch reproduces a plain
  run) and a (seed, rank) SeedSequence draw elsewhere, so no two ranks share a stream.
- Gradients: after the accumulation loop every trainable gradient *and logZ's* is all-reduced
  and divided by the world size (:meth:`DistContext.average_gradients`), before clipping and the
  optimizer step. The policy is not wrapped in DDP: the same explicit reduction covers the model,
  the LoRA adapters and the logZ scalar, which lives outside the model in its own parameter group,
  and sampling/reference passes run on the bare model. Identical gradients, identical initial
  weights and identical optimizer states keep every rank's parameters and logZ equal.
  The objectives that average per trajectory (tb, raptb, avg_prefix_tb, root_subtb_logz, subtb
  with per-trajectory normalisation) then equal their single-process value; batch statistics
  (vargrad's logZ estimate, held over the rank's share of the step) are computed per rank, like
  unsynchronised batch norm. GRPO's advantages and token count are the whole step's (one gather).
- Replay: each step's new items are gathered from all ranks (rank order) and every rank adds the
  same list to its own buffer; the refresh (SubM selection, RP/PRT insertion) is deterministic, so
  all buffers stay identical without a broadcast. Every rank draws the step's replay rows for all
  ranks from the shared RNG (the same draw everywhere) and keeps its own rows'.
- Checkpoints: rank 0 writes; the file holds every rank's RNG states (:func:`rank_rng_state`).
  Resuming on the same world size restores each rank's streams exactly; on another world size the
  run continues with a warning (ranks without a saved stream get a fresh one).
- Precision: on CUDA the policy runs in bf16 (``adapters.lm.lora.preferred_dtype``) while logZ stays
  a float32 parameter; gradients are reduced in their own dtypes. accelerate's
  ``mixed_precision`` setting is not used because the model is not wrapped by ``prepare``.
- Timeout: every collective waits at most ``distributed.timeout`` seconds (the process group's
  timeout). Before each collective a rank records in the launcher's store how many it has
  entered, so when one fails the rank that reports it can name the ranks that never got there
  (:class:`PeerFailure`, one line, exit 2: a stopped, hung or dead process; resume with
  ``--resume``).
- FSDP (an accelerate config with ``distributed_type: FSDP``, version 2): the same rules, with
  the policy sharded across ranks; ``app.distribution.sharding`` states what sharding adds.
  DeepSpeed is refused clearly (see docs/distributed.md).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from raptb.app.configuration.sections import DistributedConfig
from raptb.app.distribution.peer_failure import PEER_GONE, PeerFailure
from raptb.app.distribution.sharding import ShardingPlan, is_sharded, plan_from_accelerate

T = TypeVar("T")

# accelerate distributed types the explicit gradient all-reduce is correct for
_DATA_PARALLEL = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU"}
DEFAULT_TIMEOUT = DistributedConfig.model_fields["timeout"].default
"""Seconds a collective waits when no configuration says otherwise."""
DEEPSPEED_REFUSED = (
    "DeepSpeed is not supported: raptb trains data-parallel or fully sharded (accelerate configs "
    "with distributed_type MULTI_GPU / MULTI_CPU, or FSDP)"
)
_ENTERED = itertools.count(1)  # collectives this process has entered
_ENTERED_KEY = "raptb/entered/{rank}"


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the run: rank, world size, its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    sharding: ShardingPlan | None = None
    """How the training policy is sharded (an FSDP launch); None: each rank holds the whole
    model."""

    @classmethod
    def single(cls, device: torch.device | None = None) -> DistContext:
        """One process: the GPU when there is one, else the CPU."""
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return cls(rank=0, world_size=1, local_rank=0, device=device)

    @classmethod
    def from_accelerate(cls, timeout: float = DEFAULT_TIMEOUT) -> DistContext:
        """The context from accelerate's ``PartialState`` (initialises the process group when
        launched by ``accelerate launch``/torchrun; a single-process context otherwise).

        Without a launcher's ``WORLD_SIZE`` > 1 in the environment, accelerate is not consulted:
        one process, as :meth:`single`. ``timeout``: seconds each collective waits for every
        rank (see the module docstring).

        An FSDP launch (``ACCELERATE_USE_FSDP``) carries its :class:`ShardingPlan`. Raises
        ValueError (one line) for DeepSpeed launches and FSDP settings this trainer does not
        implement.
        """
        if _env_flag("ACCELERATE_USE_DEEPSPEED"):
            raise ValueError(DEEPSPEED_REFUSED)
        sharding = plan_from_accelerate() if _env_flag("ACCELERATE_USE_FSDP") else None
        if launched_world_size() <= 1:
            return cls.single()
        from accelerate import PartialState

        # without CUDA (or with ACCELERATE_USE_CPU) PartialState needs cpu=True to see a
        # multi-process launch as MULTI_CPU (gloo) instead of one process per rank
        cpu = not torch.cuda.is_available() or _env_flag("ACCELERATE_USE_CPU")
        state = PartialState(cpu=cpu, timeout=timedelta(seconds=timeout))
        kind = state.distributed_type.name
        if kind not in _DATA_PARALLEL:
            raise ValueError(
                f"distributed type {kind} is not supported: raptb trains data-parallel or fully "
                "sharded (accelerate configs with distributed_type MULTI_GPU / MULTI_CPU, or FSDP)"
            )
        return cls(
            rank=state.process_index,
            world_size=state.num_processes,
            local_rank=state.local_process_index,
            device=state.device,
            sharding=sharding,
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- collectives (identities in one process) -----------------------------------------------

    def all_gather_object(self, obj: T) -> list[T]:
        """``obj`` from every rank, in rank order (pickled; for small host values)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        watched(lambda: dist.all_gather_object(out, obj))
        return out

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        watched(lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank gets here (e.g. until rank 0 has prepared the run directory)."""
        if self.world_size > 1:
            watched(dist.barrier)

    def on_main(self, work: Callable[[], T]) -> T:
        """``work()`` run on rank 0 only, its result on every rank; an exception it raises is
        raised on every rank too, so no rank waits for a rank that gave up."""
        result: Any = None
        error: BaseException | None = None
        if self.is_main:
            try:
                result = work()
            except Exception as exc:  # handed to the other ranks, then raised here as well
                error = exc
        if self.world_size > 1:
            result, error = self.broadcast_object((result, error))
        if error is not None:
            raise error
        return result

    def sum_counts(self, counts: dict[str, int]) -> dict[str, int]:
        """Integer counters summed over ranks (same keys on every rank)."""
        ranks = self.all_gather_object(counts)
        return {key: sum(rank[key] for rank in ranks) for key in counts}

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (e.g. a stop request seen by one process)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        watched(lambda: dist.all_reduce(value, op=dist.ReduceOp.MAX))
        return bool(value.item())

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank."""
        return not self.any_true(not flag)

    def average_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """Replace each parameter's gradient by its mean over ranks (one all-reduce per
        device and dtype). A missing gradient counts as zeros, so every rank reduces the same
        tensors in the same order. Sharded parameters are skipped: FSDP averaged their gradients
        in backward."""
        if self.world_size == 1:
            return
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in params:
            if is_sharded(p):
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in groups.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            watched(lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM))  # noqa: B023
            flat /= self.world_size
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


def watched(collective: Callable[[], object]) -> None:
    """Run ``collective`` after recording in the launcher's store that this rank entered it; a
    failure (a timeout, a peer's closed connection) becomes a :class:`PeerFailure` naming the
    ranks that did not get this far."""
    entered = next(_ENTERED)
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(_ENTERED_KEY.format(rank=dist.get_rank()), str(entered))
        collective()
    except RuntimeError as exc:  # torch's DistBackendError / DistStoreError and gloo's faults
        raise PeerFailure(_peer_failure_line(entered, exc)) from exc


def _peer_failure_line(entered: int, exc: RuntimeError) -> str:
    """Which ranks did not reach the collective this rank entered as its ``entered``-th (or, when
    all did, which may not have left it), and what to do."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peers = [peer for peer in range(world) if peer != rank]
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=5))
        keys = {peer: _ENTERED_KEY.format(rank=peer) for peer in peers}
        behind = [
            peer
            for peer, key in keys.items()
            if not store.check([key]) or int(store.get(key)) < entered
        ]
        note = ""
    except RuntimeError:  # the launcher's store is gone too
        behind, note = [], "; the launcher's store did not answer either"
    suspects = behind or peers
    if len(suspects) == 1:
        who = f"rank {suspects[0]}"
    else:
        who = ("ranks " if behind else "one of ranks ") + ", ".join(map(str, suspects))
    text = str(exc).lower()
    what = (
        "did not answer within distributed.timeout"
        if "timed out" in text or "timeout" in text
        else PEER_GONE
    )
    return (
        f"{who} {what} (seen by rank {rank} at collective {entered}{note}): the process "
        "died, was stopped or hangs; the run's newest checkpoint is intact, continue with "
        "--resume"
    )


def leave_process_group() -> None:
    """After a command's last collective: wait for every rank, then destroy the process group.
    Left to the interpreter's exit, gloo's threads can abort a process ("terminate called without
    an active exception") after its work is done, failing the launch. No-op in a process no
    launcher started (no ``WORLD_SIZE``): a group there is another library's (an in-process vLLM
    engine makes one of one rank and destroys it itself at exit)."""
    launched = "WORLD_SIZE" in os.environ
    if launched and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def dist_rank() -> int:
    """This process's rank as the launcher set it (0 when not launched)."""
    return int(os.environ.get("RANK", "0"))


def launched_world_size() -> int:
    """The number of processes the launcher started (1 when not launched)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in {"1", "true", "yes"}


# --- batch and seeds ---------------------------------------------------------------------------


def per_rank_batch(batch_size: int, world_size: int) -> int:
    """Rows each rank takes of a global micro-batch of ``batch_size``; ValueError when it does not
    split evenly."""
    if batch_size % world_size:
        raise ValueError(
            f"optim.batch_size {batch_size} does not split evenly over {world_size} processes; "
            f"use a multiple of {world_size} (it is the global micro-batch, summed over ranks)"
        )
    return batch_size // world_size


def sampling_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s rollout generator and dropout: ``seed`` itself on rank 0, a
    SeedSequence((seed, rank)) draw (63 bits) on the others."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0] >> 1)


# --- RNG state for checkpoints -----------------------------------------------------------------


def rank_rng_state(generator: torch.Generator) -> dict[str, Any]:
    """This rank's RNG streams: the rollout generator, torch's global RNG (dropout) and Python's."""
    version, internal, gauss = random.getstate()
    return {
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": [version, list(internal), gauss],
    }


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def restore_rank_rng(
    ctx: DistContext,
    saved: Sequence[dict[str, Any]],
    generator: torch.Generator,
    *,
    seed: int,
    step: int,
    warn: Callable[[str], None],
) -> None:
    """Restore this rank's streams from ``saved`` (one entry per rank of the writing run).

    On another world size the run goes on after one ``warn`` line (rank 0): a rank with a saved
    entry takes it, the others reseed from (seed, rank, step), so they do not repeat the stream
    of an earlier step."""
    if len(saved) != ctx.world_size and ctx.is_main:
        warn(
            f"checkpoint written by {_processes(len(saved))}, resuming on {ctx.world_size}: "
            "training continues, but not as the uninterrupted run would (rollout streams are "
            "reassigned)"
        )
    if ctx.rank >= len(saved):
        fresh = np.random.SeedSequence([seed, ctx.rank, step]).generate_state(1, np.uint64)[0]
        generator.manual_seed(int(fresh >> 1))
        torch.manual_seed(int(fresh >> 1))
        return
    state = saved[ctx.rank]
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
