"""A rollout lane in a process of its own: a forked copy of the policy that rolls out its rows.

A decoding forward of a pretrained model is thousands of small operations a token (SmolLM2-135M
with LoRA: ~4,300 a forward), each entering and leaving Python's lock. Two lanes as threads of one
process hand that lock back and forth at every operation: on the 2-core AMD EPYC of
benchmarks/pretrained_step.md, two threads each running ten 64-row decoding forwards took the time
of 1.1-1.25 running one after the other, where two processes took 1.9-2x (their products alone, in
threads, 1.9-2x). The loss's micro-batches (products over whole rows, a few large operations)
scale in threads and stay there (``adapters.lm.lanes``).

:class:`LaneProcess` forks the process once, at the first lane rollout (``os.fork`` through
``multiprocessing``'s fork context; Linux only): the child holds the policy as it was, its frozen
weights shared with the parent page for page (never written, so never copied). Each call sends the
lane's arguments and the current values of the parameters that train (LoRA's adapters: ~20 MB on
SmolLM2-135M r16; raw bytes, one buffer a dtype, by value rather than through
``torch.multiprocessing``'s shared memory), the child copies them in, rolls the rows out with
``rollout`` (the same code, the same seed, one torch thread) and sends the ``Rollout`` back while
the caller rolls out its own lane. The rows are the ones a thread lane draws (tested). The child
ignores SIGINT (the parent's stop request finishes the step, its rollout included), ends when its
pipe closes (as when the parent ends), and is ended with the parent (daemon). Where it has ended
before sending its rows back (killed for memory, or a SIGTERM sent to the whole job), the caller
rolls them out itself, the same rows, warns once, and runs the rollout's lanes as threads from
then on (``ENDED``); an error raised in the child is raised in the caller.

The trainer runs a rollout's lanes so on a CPU under Linux (``Lanes(..., processes=True)``);
elsewhere (no fork, or a GPU, whose CUDA context a forked child cannot use) they are threads.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import platform
import signal
import traceback
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

Rollout = Any
"""``adapters.lm.rollout_record.Rollout`` (not imported: this module sits under it)."""


def can_fork() -> bool:
    """Whether a lane may run in a forked process here (Linux: fork is its start method)."""
    return platform.system() == "Linux"


ENDED = (
    "lanes: a rollout lane's process ended (out of memory, or a signal): its rows were rolled out "
    "here, and the run's rollout lanes are threads from now on (lanes = 1: one lane)"
)
"""The warning where a lane's process has ended (``LaneEnded``)."""


class LaneEnded(RuntimeError):
    """A lane's process ended before it sent its rollout back."""


Groups = list[tuple[torch.dtype, list[torch.Tensor]]]


def _trainable(model: torch.nn.Module) -> tuple[list[str], Groups]:
    """The names of ``model``'s trainable parameters, and the parameters grouped by dtype in order
    of first appearance (each group in order): one buffer a group crosses the pipe."""
    names: list[str] = []
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            names.append(name)
            groups.setdefault(p.dtype, []).append(p)
    return names, list(groups.items())


class LaneProcess:
    """One forked copy of ``policy`` rolling out one lane's rows a call (the module docstring).

    ``rollout(policy, **arguments)`` is what the child runs (``adapters.lm.rollout``'s eager
    rollout); ``threads``: the child's torch threads."""

    def __init__(self, policy: Any, rollout: Callable[..., Rollout], threads: int = 1) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns of fork in a process with threads (torch's, the lanes'): the
            # child runs its own rollout on one thread and none of theirs
            warnings.simplefilter("ignore", DeprecationWarning)
            self._process = context.Process(
                target=_serve,
                args=(child, self._conn, policy, rollout, threads),
                name="raptb-rollout-lane",
                daemon=True,
            )
            self._process.start()
        child.close()
        self._ended = self._pending = False
        # at close, when collected, or at the interpreter's exit
        self.close = weakref.finalize(self, _end, self._conn, self._process)

    def start(self, model: torch.nn.Module, arguments: dict[str, Any]) -> None:
        """Send one lane's rollout (``arguments``, then the values of ``model``'s trainable
        parameters now, as raw bytes: one buffer a dtype); ``result`` waits for it."""
        names, groups = _trainable(model)
        header = (arguments, names, [(dtype, len(members)) for dtype, members in groups])
        self._pending = True
        try:
            self._conn.send_bytes(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
            for _, members in groups:
                flat = torch.cat([p.detach().reshape(-1) for p in members])
                self._conn.send_bytes(flat.view(torch.uint8).numpy())
        except OSError:  # the child has ended: ``result`` says so
            self._ended = True

    def result(self) -> Rollout:
        """The rollout sent by ``start``; raises ``LaneEnded`` where the child has ended,
        RuntimeError where it failed."""
        self._pending = False
        if self._ended:
            raise LaneEnded(ENDED)
        try:
            kind, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise LaneEnded(ENDED) from exc
        if kind == "error":
            raise RuntimeError(f"lanes: a rollout lane's process failed:\n{value}")
        return value

    def discard(self) -> None:
        """Read and drop the rollout sent by ``start`` if it has not been read (the caller's own
        lane failed): the next call's ``result`` must not read this one's rows."""
        if self._pending:
            with contextlib.suppress(Exception):
                self.result()


def _end(conn: Connection, process: multiprocessing.process.BaseProcess) -> None:
    """``LaneProcess.close``: the pipe closed, so the child's loop returns (a rollout in progress
    finishes first); killed if it has not ended within 10 s."""
    conn.close()
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join()


def _serve(
    conn: Connection,
    parent_end: Connection,
    policy: Any,
    rollout: Callable[..., Rollout],
    threads: int,
) -> None:
    parent_end.close()  # held open here too, the parent's end would never read as ended
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent's stop request finishes
    torch.set_num_threads(threads)
    own, groups = _trainable(policy.model)
    while True:
        try:
            arguments, names, sizes = pickle.loads(conn.recv_bytes())
            raws = [conn.recv_bytes() for _ in sizes]
        except (EOFError, OSError):
            return
        try:
            if names != own or sizes != [(d, len(m)) for d, m in groups]:
                raise RuntimeError(
                    "the trainable parameters changed since the lane's process began"
                )
            with torch.no_grad():
                for (dtype, members), raw in zip(groups, raws, strict=True):
                    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
                    for p, value in zip(
                        members, flat.split([m.numel() for m in members]), strict=True
                    ):
                        p.copy_(value.view_as(p))
                out = rollout(policy, **arguments)  # (it sets the model's mode itself)
            reply = ("ok", out)
        except Exception:  # sent to the parent, which raises it
            reply = ("error", traceback.format_exc())
        try:
            conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the parent closed the pipe (or ended) during the rollout
            return
