"""adapters.lm.lane_process: a rollout's lanes after the first in forked processes.

- the rows, their log-probabilities and texts are bit for bit those of the same lanes as threads
  (per-row prompts and temperatures, with and without a grammar), on a LoRA-wrapped random
  Llama-shaped model; after the adapters' weights change in the parent the next rollout draws
  from the new weights in the child too (the thread lanes' rows again);
- a failure in the child (its trainable parameters no longer the parent's) is raised in the
  parent, naming the lanes; ``close`` ends the process;
- a child killed before it sends its rows back: the caller rolls them out (the same rows), warns
  once, and runs the lanes as threads after; a process that never closed its lanes exits;
- where the caller's own lane fails, the child's rows of that call are dropped, not read by the
  next rollout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raptb.adapters.lm import rollout
from raptb.adapters.lm.lane_process import can_fork
from raptb.adapters.lm.lanes import Lanes
from tests.adapters.test_policy import PROMPT
from tests.adapters.test_static_decode import GRAMMAR, llama_lora_policy

pytestmark = pytest.mark.skipif(not can_fork(), reason="lanes in processes need fork (Linux)")


def _sample(policy, lanes: Lanes, seed: int):
    policy.lanes = lanes
    n = 7
    return policy.sample(
        [PROMPT if i % 3 else "" for i in range(n)],
        n,
        min_length=1,
        max_length=6,
        temperature=torch.linspace(0.7, 1.5, n),
        generator=torch.Generator().manual_seed(seed),
    )


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.length, b.length)
    assert torch.equal(a.log_pf, b.log_pf)
    assert torch.equal(a.log_pterm, b.log_pterm)
    assert a.texts == b.texts


@pytest.mark.parametrize("grammar", [None, GRAMMAR], ids=["free", "grammar"])
def test_process_lanes_draw_the_thread_lanes_rows(grammar: str | None) -> None:
    policy = llama_lora_policy(grammar)
    threads, processes = Lanes(2), Lanes(2, processes=True)
    assert processes.in_processes and not threads.in_processes
    try:
        for seed in (3, 4):
            _same(_sample(policy, processes, seed), _sample(policy, threads, seed))
        assert len(processes._processes) == 1  # forked once
        before = _sample(policy, threads, 5)
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if "lora_B" in name:
                    param.mul_(-2.0)  # an optimizer step in the parent
        after = _sample(policy, threads, 5)
        assert not torch.equal(before.log_pf, after.log_pf)
        _same(_sample(policy, processes, 5), after)
    finally:
        processes.close()


def test_a_failure_in_the_lanes_process_is_raised() -> None:
    policy = llama_lora_policy(None)
    lanes = Lanes(2, processes=True)
    try:
        _sample(policy, lanes, 3)
        process = lanes._processes[0]._process
        assert process.is_alive()
        next(p for p in policy.model.parameters() if p.requires_grad).requires_grad_(False)
        with pytest.raises(RuntimeError, match="lanes: a rollout lane's process failed"):
            _sample(policy, lanes, 3)
    finally:
        lanes.close()
    assert not process.is_alive()


def test_a_lanes_process_that_ended_leaves_its_rows_to_the_caller() -> None:
    """Killed (for memory, or by a signal to the whole job), the child's rows are rolled out by
    the caller, the same rows, with one warning; lanes are threads from then on."""
    policy = llama_lora_policy(GRAMMAR)
    threads, processes = Lanes(2), Lanes(2, processes=True)
    try:
        _sample(policy, processes, 3)
        child = processes._processes[0]._process
        child.kill()
        child.join()
        with pytest.warns(RuntimeWarning, match="lanes: a rollout lane's process ended"):
            out = _sample(policy, processes, 4)
        _same(out, _sample(policy, threads, 4))
        assert not processes.in_processes and processes._processes == []
        _same(_sample(policy, processes, 5), _sample(policy, threads, 5))  # as threads
    finally:
        processes.close()


def test_a_process_that_never_closed_its_lanes_exits() -> None:
    """At the interpreter's exit, the lanes still held, the lane's process ends (multiprocessing's
    own handler sends the daemon a SIGTERM and waits for it: a child that ignored it hung there)."""
    script = (
        "import torch\n"
        "from raptb.adapters.lm.lanes import Lanes\n"
        "from tests.adapters.test_lane_process import _sample\n"
        "from tests.adapters.test_static_decode import llama_lora_policy\n"
        "policy, lanes = llama_lora_policy(None), Lanes(2, processes=True)\n"
        "_sample(policy, lanes, 3)\n"
        "print('rolled out')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "rolled out" in done.stdout


def test_a_failure_in_the_callers_lane_leaves_no_rows_for_the_next_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the caller's own lane raises, the child's rows of that call are read and dropped: the
    next rollout gets its own rows, not the failed call's."""
    policy = llama_lora_policy(None)
    threads, processes = Lanes(2), Lanes(2, processes=True)
    try:
        _sample(policy, processes, 3)  # forked here, with the real rollout
        real = rollout._seeded_rollout

        def failing(policy: object, lane: int, **arguments: object) -> object:
            if lane == 0:
                raise ValueError("the caller's lane failed")
            return real(policy, lane=lane, **arguments)

        monkeypatch.setattr(rollout, "_seeded_rollout", failing)
        with pytest.raises(ValueError, match="the caller's lane failed"):
            _sample(policy, processes, 4)
        monkeypatch.setattr(rollout, "_seeded_rollout", real)
        _same(_sample(policy, processes, 5), _sample(policy, threads, 5))
    finally:
        processes.close()
