"""Calling the task's reward: failures counted and reported in groups, slow rewards in a pool.

Every reward call ends in one of three outcomes:

- a finite score: kept;
- an exception: the sample scores ``Score(0, False)`` (invalid), counted by exception type;
- a NaN or infinite value: ``Score(0, False)`` too, counted as non-finite (a tasks' ``score``
  may hide those; ``unchecked_score``, where a task has it, shows them).

``take_counts`` closes a step: it returns the step's counts for ``metrics.jsonl``
(``reward_errors``, ``reward_nonfinite``), emits one warning line per distinct exception type
(with its count and one example) and one for the non-finite values, and stops the run with
``RewardFailure`` after ``max_failed_steps`` consecutive steps whose every call failed.

``workers = N >= 1`` scores distinct texts in a pool of N processes (``concurrent.futures``
over the ``spawn`` start method: no forked copy of the trainer's torch threads). The task is
pickled once per worker, so it must be picklable (a reward function defined at module level is).
A spawned worker re-imports the main module; the ``raptb`` command's is ``app.entry``, which
imports nothing heavy, so a worker starts in about the time its task's imports take.
Outcomes come back in order and as the same Python floats, so pooled scores equal serial ones.

Finished texts and prefixes (``finished=False``: a prefix x_1..x_k with k < tau) are scored by
the task's ``score`` and, where it has one, ``prefix_score`` (the Task port). A task with
``score_batch(prompt, texts)`` has its finished texts scored in one call per chunk (AMP's oracle
is far faster batched); when that call raises, the chunk is scored one by one, so a failure is
still counted per text.
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from raptb.core.ports import Score, Task, TaskCapabilities

Outcome = tuple[str, Any, Any]
"""("ok", value, valid) | ("error", exception type name, message) | ("nonfinite", repr, "")."""

CHUNKS_PER_WORKER = 4
"""Texts are sent in about this many chunks per worker: few round trips, balanced load."""

_worker_task: Task | None = None


class RewardFailure(ValueError):
    """The reward failed on every call for too many steps, or cannot run in workers."""


def _outcome(score: Score) -> Outcome:
    value = float(score.value)
    if not math.isfinite(value):
        return ("nonfinite", repr(value), "")
    return ("ok", value, bool(score.valid))


def _call(able: TaskCapabilities, prompt: str, text: str, finished: bool = True) -> Outcome:
    score_fn = able.score if finished else able.prefix_score or able.score
    try:
        return _outcome(score_fn(prompt, text))
    except Exception as exc:  # any fault of the user's reward marks this one sample invalid
        return ("error", type(exc).__name__, str(exc)[:200])


def _call_many(task: Task, prompt: str, texts: Sequence[str], finished: bool) -> list[Outcome]:
    """Outcomes of ``texts``: one ``score_batch`` call for finished texts where the task has it
    (one by one when it raises, to count each failure), else one call per text."""
    able = TaskCapabilities.of(task)  # once per call, not per text
    batch = able.score_batch
    if finished and batch is not None and len(texts) > 1:
        try:
            scores = list(batch(prompt, list(texts)))
            if len(scores) != len(texts):
                raise ValueError(f"score_batch returned {len(scores)} scores for {len(texts)}")
            return [_outcome(score) for score in scores]
        except Exception:  # located text by text below, with the failures counted
            pass
    return [_call(able, prompt, text, finished) for text in texts]


def _init_worker(task: Task) -> None:
    global _worker_task
    _worker_task = task
    # the trainer decides what Ctrl-C and SIGTERM do; a worker dying of them would break the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _score_chunk(prompt: str, texts: Sequence[str], finished: bool) -> list[Outcome]:
    assert _worker_task is not None  # set by _init_worker
    return _call_many(_worker_task, prompt, texts, finished)


class RewardCaller:
    """Scores texts with ``task`` (see the module docstring); ``name`` names the reward in
    messages (e.g. the custom reward's ``module:function``)."""

    def __init__(
        self,
        task: Task,
        *,
        workers: int = 0,
        name: str | None = None,
        max_failed_steps: int | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.task = task
        self.workers = workers
        self.name = name or f"task {task.name}"
        self.max_failed_steps = max_failed_steps
        self.warn = warn
        self._pool: ProcessPoolExecutor | None = None
        self._calls = 0
        self._errors: Counter[str] = Counter()
        self._examples: dict[str, str] = {}
        self._nonfinite = 0
        self._failed_in_row = 0
        self._run_errors: Counter[str] = Counter()
        self._run_nonfinite = 0
        self._steps_with_failures = 0

    def score_many(
        self, prompt: str, texts: Sequence[str], *, finished: bool = True
    ) -> list[Score]:
        """One Score per text, in order (duplicates are scored once); ``finished=False`` scores
        them as unfinished prefixes (the task's ``prefix_score`` where it has one)."""
        distinct = list(dict.fromkeys(texts))
        outcomes = dict(zip(distinct, self._outcomes(prompt, distinct, finished), strict=True))
        scores = {}
        for text, (kind, a, b) in outcomes.items():
            self._calls += 1
            if kind == "ok":
                scores[text] = Score(a, b)
                continue
            if kind == "error":
                self._errors[a] += 1
                self._examples.setdefault(a, f"{b!r} on {text!r}")
            else:
                self._nonfinite += 1
                self._examples.setdefault("nonfinite", f"{a} on {text!r}")
            scores[text] = Score(0.0, False)
        return [scores[text] for text in texts]

    def _outcomes(self, prompt: str, texts: list[str], finished: bool) -> list[Outcome]:
        if self.workers < 1 or len(texts) < 2:
            return _call_many(self.task, prompt, texts, finished)
        pool = self._pool or self._start_pool()
        size = max(1, math.ceil(len(texts) / (self.workers * CHUNKS_PER_WORKER)))
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        done = pool.map(_score_chunk, [prompt] * len(chunks), chunks, [finished] * len(chunks))
        return [outcome for chunk in done for outcome in chunk]

    def _start_pool(self) -> ProcessPoolExecutor:
        try:
            pickle.dumps(self.task)
        except Exception as exc:
            raise RewardFailure(
                f"reward workers: {self.name} cannot be sent to worker processes ({exc}); define "
                "the reward at module level or set [reward] workers = 0"
            ) from None
        self._pool = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.task,),
        )
        return self._pool

    def take_counts(self, step: int) -> dict[str, int]:
        """Close optimizer step ``step``: warn, check the failure limit, return its counts.

        Raises:
            RewardFailure: every call failed in ``max_failed_steps`` consecutive steps.
        """
        errors, nonfinite, calls = sum(self._errors.values()), self._nonfinite, self._calls
        for kind, count in sorted(self._errors.items()):
            self._emit(
                f"step {step}: {self.name} raised {kind} on {count} of {calls} calls "
                f"(e.g. {self._examples[kind]}); those samples count as invalid"
            )
        if nonfinite:
            self._emit(
                f"step {step}: {self.name} returned a non-finite value on {nonfinite} of "
                f"{calls} calls (e.g. {self._examples['nonfinite']}); those samples "
                "count as invalid"
            )
        self._run_errors.update(self._errors)
        self._run_nonfinite += nonfinite
        self._steps_with_failures += bool(errors or nonfinite)
        if calls:
            self._failed_in_row = self._failed_in_row + 1 if errors + nonfinite == calls else 0
        last = next(iter(self._examples.values()), "")
        self._calls, self._nonfinite = 0, 0
        self._errors.clear()
        self._examples.clear()
        if self.max_failed_steps is not None and self._failed_in_row >= self.max_failed_steps:
            raise RewardFailure(
                f"the reward {self.name} failed on every call for {self._failed_in_row} "
                f"consecutive steps (last: {last}); fix it, or raise [reward] max_failed_steps"
            )
        return {"reward_errors": errors, "reward_nonfinite": nonfinite}

    def summary_lines(self) -> list[str]:
        """End-of-run totals, one line per exception type and one for non-finite values."""
        lines = [
            f"{self.name} raised {kind} {count} times in total"
            for kind, count in sorted(self._run_errors.items())
        ]
        if self._run_nonfinite:
            lines.append(f"{self.name} returned {self._run_nonfinite} non-finite values in total")
        if lines:
            lines.append(
                f"reward failures occurred in {self._steps_with_failures} steps; "
                "see reward_errors and reward_nonfinite in metrics.jsonl"
            )
        return lines

    def _emit(self, line: str) -> None:
        if self.warn is not None:
            self.warn(line)

    def close(self) -> None:
        """Stop the worker pool, if one was started (a later call starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
