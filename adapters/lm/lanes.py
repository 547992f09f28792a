"""Lanes: a step's work in parts side by side, each in a thread with torch threads of its own.

A pretrained model's step on a CPU is products of 32-128 rows, one token at a time in the rollout,
through 210 LoRA layers: torch's threads split each such product between the cores and scale
poorly (SmolLM2-135M, the SMILES preset's 128-row step: two threads 1.46x one). The same work
split by rows instead, each part in a thread of its own on one torch thread (on two cores; on
more, its share of torch's threads), keeps every product whole on one core: measured, the
rollout's 128 rows as two lanes of 64 and the four 32-row rescorings and backwards as two lanes
of two (benchmarks/pretrained_step.md, "Lanes").

:class:`Lanes` runs such parts (``run``); a count of 1 runs them one after the other in the
caller's thread, exactly as before. The GFlowNet step runs its micro-batches in lanes, and the
reference pass its rows (``adapters.lm.rescoring.lanes_log_probs``); the RL baselines' losses keep
state across micro-batches (entropy sums, PPO's passes) and run in turn. ``run`` called inside a
lane runs its parts in turn, in that lane.
Work in a lane must not switch the model's mode or peft's adapter (model-wide state): the caller
sets them around ``run``.

What a lane draws is its own, so a run is the same for the same seed and lanes, whichever thread
finishes first: ``run`` draws each lane a seed from torch's global generator, in lane order, for
the dropout masks drawn in the lane (``adapters.lm.cpu_dropout``); a rollout's lanes take seeds
from the rollout's generator (``adapters.lm.rollout``) and draw none from the global one, in
threads or in processes alike. A backward in a lane (:func:`backward`)
adds its gradients to the lane's own sums, which ``run(..., gradients=params)`` adds to the
parameters' ``.grad`` in lane order after every lane has finished (torch's own accumulation from
two threads would add them in whichever order they come).

A lane runs under its caller's autograd modes (``torch.no_grad``, ``torch.inference_mode``), which
are the caller's thread's own and a new thread would not have.

The loss's lanes are threads: torch releases Python's lock inside its operations, which there are
few and large, and the model and its gradients stay one copy. ``concurrent.futures`` (the
standard library) holds the threads. A rollout's decoding forwards are many small operations,
whose threads hand the lock back and forth: with ``processes``, its lanes after the first run in
forked processes (``adapters.lm.lane_process``; the same rows).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import torch

from raptb.adapters.lm import cpu_dropout
from raptb.adapters.lm.lane_process import LaneProcess, can_fork

T = TypeVar("T")
_local = threading.local()


DEFAULT_LANES = 2
"""``lanes = None``'s count where lanes run: two halves of the rows, measured on two cores; on more
cores each lane takes its share of torch's threads, so that no product is cut into slivers of a
few rows (not measured here: a machine with more cores may prefer torch's own threads alone,
``lanes = 1``)."""


SHARDED_ONE_LANE = (
    "lanes: a sharded model's forwards and backwards are collectives every process runs in the "
    "same order, so it runs one lane (drop lanes, or set it to 1)"
)
"""The run's warning where ``lanes`` > 1 meets a sharded model."""


def lane_count(
    asked: int | None,
    device: torch.device,
    lean: bool,
    sharding: object | None,
    warn: Callable[[str], None],
) -> int:
    """The lanes a run takes: ``asked`` (``lanes``), or where it is None ``DEFAULT_LANES`` (at
    most torch's thread count) for a pretrained model (one the lean embedded path does not run)
    on a CPU, else 1; always 1 for a sharded model (``sharding`` not None; ``warn`` told where
    more were asked)."""
    if sharding is not None:
        if asked is not None and asked > 1:
            warn(SHARDED_ONE_LANE)
        return 1
    if asked is not None:
        return asked
    if device.type != "cpu" or lean:
        return 1
    return min(DEFAULT_LANES, torch.get_num_threads())


def split(count: int, parts: int) -> list[range]:
    """``count`` items in at most ``parts`` contiguous ranges of sizes differing by at most one
    (the first ones larger); no empty range."""
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    ranges, start = [], 0
    for lane in range(parts):
        stop = start + size + (lane < extra)
        ranges.append(range(start, stop))
        start = stop
    return ranges


class _Sums:
    """A lane's gradient sums over ``params`` (None where nothing was added)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)

    def add(self, tensor: torch.Tensor) -> None:
        grads = torch.autograd.grad(tensor, self.params, allow_unused=True)
        for i, grad in enumerate(grads):
            if grad is not None:
                self.grads[i] = grad if self.grads[i] is None else self.grads[i] + grad


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``; in a lane of ``run(..., gradients=params)``, its gradients with
    respect to ``params`` added to the lane's sums instead (the module docstring)."""
    sums = getattr(_local, "sums", None)
    if sums is None:
        tensor.backward()
    else:
        sums.add(tensor)


class Lanes:
    """Up to ``count`` parts of work side by side (the module docstring)."""

    def __init__(self, count: int, threads: int | None = None, processes: bool = False) -> None:
        """``threads``: torch threads in each lane; None: torch's thread count now divided among
        the lanes (at least one each). ``processes``: a rollout's lanes after the first in
        processes of their own (``processes``; where ``lane_process.can_fork``), not threads."""
        if count < 1:
            raise ValueError(f"lanes: must be >= 1, got {count}")
        self.count = count
        self.threads = max(1, torch.get_num_threads() // count) if threads is None else threads
        self.in_processes = processes and count > 1 and can_fork()
        self._pool: ThreadPoolExecutor | None = None
        self._processes: list[LaneProcess] = []

    def processes(self, policy: Any, rollout: Callable[..., Any]) -> list[LaneProcess]:
        """The processes that roll out lanes 1.. of ``policy``'s rollouts (``rollout``: what each
        runs), forked at the first call; empty where lanes run as threads."""
        if self.in_processes and not self._processes:
            self._processes = [
                LaneProcess(policy, rollout, self.threads) for _ in range(self.count - 1)
            ]
        return self._processes

    def lost_processes(self) -> None:
        """A lane's process has ended (``lane_process.LaneEnded``): the others are ended and the
        rollout's lanes are threads from now on."""
        self.in_processes = False
        self.close()

    def close(self) -> None:
        """End the lanes' processes and threads (a later call starts them again)."""
        for process in self._processes:
            process.close()
        self._processes = []
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def run(
        self,
        work: Sequence[Callable[[], T]],
        gradients: Sequence[torch.Tensor] | None = None,
        dropout: bool = True,
    ) -> list[T]:
        """Each callable's result, in order; one lane each (at most ``count`` at a time).

        gradients: the parameters whose gradients a lane's :func:`backward` sums; added to their
        ``.grad`` in lane order once all have run. With one lane, or one callable, the work runs
        in the caller's thread and a backward accumulates as ``tensor.backward()`` does.
        dropout: False for work that draws no dropout mask (a rollout, in eval mode): no seed is
        drawn for it from torch's global generator."""
        if self.count == 1 or len(work) <= 1 or getattr(_local, "in_lane", False):
            return [fn() for fn in work]  # (in a lane already: its parts one after the other)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.count,
                thread_name_prefix="raptb-lane",
                initializer=torch.set_num_threads,
                initargs=(self.threads,),
            )
        seeds: list[int | None] = (
            torch.randint(0, cpu_dropout.SEED_HIGH, (len(work),)).tolist()
            if dropout
            else [None] * len(work)
        )
        sums = [None if gradients is None else _Sums(gradients) for _ in work]
        modes = _Modes(torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        futures = [
            self._pool.submit(_in_lane, fn, seed, lane_sums, modes)
            for fn, seed, lane_sums in zip(work, seeds, sums, strict=True)
        ]
        results = [future.result() for future in futures]
        for lane_sums in sums if gradients is not None else ():  # in lane order
            for param, grad in zip(gradients, lane_sums.grads, strict=True):
                if grad is not None:
                    param.grad = grad if param.grad is None else param.grad + grad
        return results


class _Modes(NamedTuple):
    """The caller's autograd modes, which are its thread's own: a lane runs under them."""

    grad: bool
    inference: bool


@contextlib.contextmanager
def lane_threads(threads: int) -> Iterator[None]:
    """torch's threads set to a lane's ``threads`` in the calling thread, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _in_lane(fn: Callable[[], T], seed: int | None, sums: _Sums | None, modes: _Modes) -> T:
    _local.sums, _local.in_lane = sums, True
    masks = (
        contextlib.nullcontext()
        if seed is None
        else cpu_dropout.drawing_from(torch.Generator().manual_seed(seed))
    )
    try:
        with torch.inference_mode(modes.inference), torch.set_grad_enabled(modes.grad), masks:
            return fn()
    finally:
        _local.sums, _local.in_lane = None, False
