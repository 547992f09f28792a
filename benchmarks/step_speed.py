"""Optimizer steps per second of the README's main job, stage by stage, and an A/B against a
commit.

The main job is ``raptb train --task expr24 --loss raptb --replay subm`` on the embedded tiny
model (its defaults: one micro-batch of 128 rows, the replay mix, SubM). One measurement builds
that trainer (seed ``--seed``, ``--threads`` torch threads; 0 = torch's choice, the default of
``raptb train`` before it chose one itself), takes ``--warmup`` untimed steps (the buffer fills,
the mix moves on) and times ``--steps`` steps of ``Trainer._optimizer_step``, the trainer's own
step. Each step is split into stages by wrapping the functions it calls (by name, so the same
worker times older code): collect (rollout model forwards, grammar, the rest of the collection),
reward (task scores), the rescoring forward (``policy.score``), objective + backward (the rest of
``loss_step``), new replay items, buffer refresh (``buffer.add``), gradient clipping + AdamW
(``apply_gradients``), and what is left (other).

Usage (from the repository root):

    python benchmarks/step_speed.py profile [--steps 100 --warmup 30 --threads 1]
    python benchmarks/step_speed.py floor [--rolled-out 40 --steps 100]
    python benchmarks/step_speed.py ab --base-python /work/venv-base/bin/python \
        --base-root /work/wt-base [--rounds 3 --threads 1 0]
    python benchmarks/step_speed.py decode [--phases 30 1000 2500 --steps 200 --loss grpo \
        --task commongen]
    python benchmarks/step_speed.py rollout|threads [--phases 30 1000 --steps 200]
    python benchmarks/step_speed.py sizes [--rounds 5 --threads 1]
    python benchmarks/step_speed.py interleave --base-python /work/venv-base/bin/python \
        --base-root /work/wt-base [--threads 1 --warmup 30 --blocks 40 --block 10]

``profile`` prints one JSON record (median ms per stage, steps/s by wall and by process CPU
time, the mean number of rows rolled out per step). ``floor`` prints the FLOPs of one step's
matrix products (``step_matmuls``: 128 rows of 9 tokens after the shared 8-token prompt, forward
and backward, and the rollout of ``--rolled-out`` rows) and the time the bare products take on
one thread. ``ab`` runs the worker for the
checkout at ``--base-root`` (its own interpreter, so its own install) and for this one,
alternating round by round, each in a fresh process, and prints a Markdown table of steps/s and
the ratio per thread setting and the stage medians of both sides. ``decode`` times one trainer
with the compiled rollout (``HFPolicy.decode`` "compiled", adapters/lm/embedded/compiled_rollout.py,
the default on the CPU) and torch's operations ("eager"), alternating step by step for ``--steps``
steps each in one process, at each step of ``--phases`` (the training carried on between phases),
with the rollout's own median milliseconds (its ``RolloutTimings``) beside the step's; ``--loss``
another loss than the main job's RapTB (a GFlowNet loss with SubM, an RL one as its defaults have
it), ``--task`` another task than Expr24. ``grammar`` and ``adamw`` alternate two settings of the
same kind in one trainer (the rollout's masks from the task's automaton or from xgrammar; AdamW's
fused or foreach update); ``threads`` the same for two torch threads against one. (The modes
``copies``, ``gelu``, ``attention``, ``rescoring``, ``one-call`` and ``rollout`` timed switches
that are gone, each path now the only one: their tables in benchmarks/step_speed.md name the
commits that measured them.) ``sizes`` times one rollout compiled and eagerly for GPT-2 models of
growing size (``SIZES``), the two alternating
``--rounds`` times.
``interleave`` is ``ab`` without the fresh processes: one worker process per side (``serve``)
builds its trainer and takes ``--warmup`` steps, then the two take turns at ``--block`` steps for
``--blocks`` turns each, the side waiting blocked on its pipe (no CPU), the order alternating turn
by turn; it prints each side's median ms per step, the ratio of medians and the median and
10th-90th percentiles of the ratios of consecutive turns (paired, so the machine's drift over
minutes, up to 2x here, falls on both sides alike).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES = (
    "rollout: model",
    "rollout: grammar",
    "collect: other",
    "reward",
    "rescoring forward",
    "objective + backward",
    "new replay items",
    "buffer refresh",
    "clip + AdamW",
    "other",
)


def _timed(spent: dict[str, float], stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding its wall time to ``spent[stage]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[stage] += time.perf_counter() - tic

    return wrapper


def _main_job(seed: int, threads: int) -> Any:
    """The README's main job's ``Trainer`` (seed ``seed``, ``threads`` torch threads, 0: torch's
    choice), writing to a temporary directory."""
    from rich.console import Console

    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    overrides: dict[str, Any] = {"task": "expr24", "loss": "raptb", "replay.kind": "subm"}
    overrides |= {"seed": seed, "threads": threads or None}
    cfg = build_config(None, overrides)
    quiet = Console(stderr=True, quiet=True)
    return Trainer(cfg, Path(tempfile.mkdtemp()), progress=False, console=quiet)


def _step_ms(trainer: Any) -> float:
    """One optimizer step of ``trainer``; its milliseconds."""
    tic = time.perf_counter()
    if trainer._optimizer_step() is not None:
        trainer.step += 1
    return 1000 * (time.perf_counter() - tic)


def serve(seed: int, threads: int, warmup: int) -> None:
    """``interleave``'s worker: the main job's trainer, ``warmup`` steps, then for each line
    ``steps K`` on stdin K steps and their milliseconds as one JSON line on stdout, until EOF."""
    trainer = _main_job(seed, threads)
    for _ in range(warmup):
        _step_ms(trainer)
    print(json.dumps({"ready": trainer.step}), flush=True)
    for line in sys.stdin:
        count = int(line.split()[1])
        print(json.dumps([_step_ms(trainer) for _ in range(count)]), flush=True)


def interleave(args: argparse.Namespace) -> None:
    """The base and this checkout in one worker process each, taking turns (module docstring)."""
    import os

    here = Path(__file__).resolve().parents[1]
    sides = {"base": (args.base_python, Path(args.base_root)), "new": (sys.executable, here)}
    threads = args.threads[0]
    env = os.environ | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    workers: dict[str, subprocess.Popen[str]] = {}
    for name, (python, root) in sides.items():  # one at a time: the warm-ups do not overlap
        command = [python, str(Path(__file__).resolve()), "serve", "--seed", str(args.seed)]
        command += ["--threads", str(threads), "--warmup", str(args.warmup)]
        worker = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert worker.stdin is not None and worker.stdout is not None
        json.loads(worker.stdout.readline())  # {"ready": step}: warmed up
        workers[name] = worker
    times: dict[str, list[float]] = {"base": [], "new": []}
    turns: dict[str, list[float]] = {"base": [], "new": []}  # median ms of each turn
    try:
        for turn in range(args.blocks):
            for name in ("base", "new") if turn % 2 == 0 else ("new", "base"):
                worker = workers[name]
                assert worker.stdin is not None and worker.stdout is not None
                worker.stdin.write(f"steps {args.block}\n")
                worker.stdin.flush()
                block = json.loads(worker.stdout.readline())
                times[name] += block
                turns[name].append(statistics.median(block))
    finally:
        for worker in workers.values():
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
    ratios = sorted(b / n for b, n in zip(turns["base"], turns["new"], strict=True))
    decile = max(0, len(ratios) // 10 - 1)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        "| threads | from step | steps each | base ms/step (median) | new ms/step (median) | "
        "ratio of medians | paired turns: median (10th-90th percentile) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    print(
        f"| {threads or 'default'} | {args.warmup} | {len(times['new'])} | "
        f"{medians['base']:.2f} | {medians['new']:.2f} | "
        f"{medians['base'] / medians['new']:.2f}x | {statistics.median(ratios):.2f}x "
        f"({ratios[decile]:.2f}-{ratios[-1 - decile]:.2f}) |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "turns": turns}))


def measure(seed: int, threads: int, warmup: int, steps: int) -> dict[str, Any]:
    """Stage medians (ms) and steps/s of ``steps`` main-job steps after ``warmup`` untimed ones."""
    import torch

    try:
        from raptb.app.training.gflownet import algorithm as gflownet
    except ModuleNotFoundError:  # the A/B's base, 7ac515c: before the app/training move
        gflownet = importlib.import_module("raptb.app.training.algorithms.gflownet")

    trainer = _main_job(seed, threads)
    algorithm = trainer.algorithm
    spent: dict[str, float] = defaultdict(float)
    rolled_out: list[int] = []
    collect = gflownet.collect_step

    def timed_collect(*args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        batch = collect(*args, **kwargs)
        total = time.perf_counter() - tic
        rolled_out.append(sum(len(piece.on_policy) for piece in batch.pieces))
        model = batch.timings.model_s if batch.timings else 0.0
        grammar = batch.timings.grammar_s if batch.timings else 0.0
        spent["rollout: model"] += model
        spent["rollout: grammar"] += grammar
        spent["collect: other"] += total - model - grammar
        return batch

    loss_step = gflownet.loss_step

    def timed_loss_step(*args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        before = spent["rescoring forward"]
        try:
            return loss_step(*args, **kwargs)
        finally:
            forward = spent["rescoring forward"] - before
            spent["objective + backward"] += time.perf_counter() - tic - forward

    gflownet.collect_step = timed_collect
    gflownet.loss_step = timed_loss_step
    gflownet.reward = _timed(spent, "reward", gflownet.reward)
    gflownet.new_items = _timed(spent, "new replay items", gflownet.new_items)
    trainer.policy.score = _timed(spent, "rescoring forward", trainer.policy.score)
    algorithm.buffer.add = _timed(spent, "buffer refresh", algorithm.buffer.add)
    trainer.apply_gradients = _timed(spent, "clip + AdamW", trainer.apply_gradients)

    def step() -> tuple[float, float]:
        tic, cpu = time.perf_counter(), time.process_time()
        if trainer._optimizer_step() is not None:
            trainer.step += 1
        return time.perf_counter() - tic, time.process_time() - cpu

    for _ in range(warmup):
        step()
    rolled_out.clear()
    per_stage: dict[str, list[float]] = defaultdict(list)
    totals, cpu_totals = [], []
    for _ in range(steps):
        spent.clear()
        total, cpu = step()
        totals.append(total)
        cpu_totals.append(cpu)
        for stage in STAGES[:-1]:
            per_stage[stage].append(spent[stage])
        per_stage["other"].append(total - sum(spent.values()))
    return {
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "steps": steps,
        "warmup": warmup,
        "seconds": sum(totals),
        "steps_per_s": steps / sum(totals),
        "steps_per_cpu_s": steps / sum(cpu_totals),
        "median_ms": {s: 1000 * statistics.median(per_stage[s]) for s in STAGES},
        "median_step_ms": 1000 * statistics.median(totals),
        "rolled_out_rows": statistics.mean(rolled_out),
    }


def step_matmuls(
    rows: int, rolled_out: int, prompt: int, length: int, shared: bool = True
) -> list[tuple]:
    """The matrix products of one main-job step of the tiny model (width 64, 2 blocks, MLP 256,
    vocabulary 98), as (m, k, n, count, grad): the rescoring forward over ``rows`` rows of
    ``length`` tokens after one shared ``prompt``, with its backward (grad: dX and dW products
    too), and the rollout's forwards (its prompt once, then ``length`` + 1 columns of
    ``rolled_out`` rows). Attention products are left out (a few percent at 17 keys).
    shared=False: the prompt computed for every row (the code before 2026-11-28)."""
    block = [(64, 192), (64, 64), (64, 256), (256, 64)]
    out = []
    prompts = prompt if shared else rows * prompt
    for m, grad in ((rows * length, True), (prompts, True)):
        out += [(m, k, n, 2, grad) for k, n in block] + [(m, 64, 98, 1, grad)]
    for m, count in ((prompt if shared else rolled_out * prompt, 1), (rolled_out, length + 1)):
        out += [(m, k, n, 2 * count, False) for k, n in block] + [(m, 64, 98, count, False)]
    return out


def floor(
    rows: int, rolled_out: int, prompt: int, length: int, repeats: int, shared: bool = True
) -> dict[str, float]:
    """FLOPs of the step's matrix products and their bare time on one thread (median of
    ``repeats``): each product (and for the rescoring its two backward products) timed alone."""
    import torch

    torch.set_num_threads(1)
    plan = step_matmuls(rows, rolled_out, prompt, length, shared)
    flops = sum(2 * m * k * n * count * (3 if grad else 1) for m, k, n, count, grad in plan)
    tensors = []
    for m, k, n, count, grad in plan:
        x, w, dy = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        tensors.append((x, w, dy, count, grad))

    def run() -> None:
        for x, w, dy, count, grad in tensors:
            for _ in range(count):
                torch.mm(x, w)
                if grad:
                    torch.mm(dy, w.t())
                    torch.mm(x.t(), dy)

    run()
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        run()
        times.append(time.perf_counter() - tic)
    seconds = statistics.median(times)
    return {"gflop": flops / 1e9, "matmul_ms": 1000 * seconds, "gflop_per_s": flops / seconds / 1e9}


def _worker(python: str, root: Path, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """One ``profile`` measurement in a fresh process of ``python`` run from ``root``."""
    command = [python, str(Path(__file__).resolve()), "profile"]
    command += ["--seed", str(args.seed), "--threads", str(threads)]
    command += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    env = None
    if threads:
        import os

        env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ab(args: argparse.Namespace) -> None:
    """Alternate the base and this checkout, print the tables."""
    here = Path(__file__).resolve().parents[1]
    sides = {"base": (args.base_python, Path(args.base_root)), "new": (sys.executable, here)}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for round_ in range(args.rounds):
        for threads in args.threads:
            for name in ("base", "new") if round_ % 2 == 0 else ("new", "base"):
                result = _worker(*sides[name], args, threads)
                runs[name, threads].append(result)
                print(
                    f"round {round_} threads {threads or 'default'} {name}: "
                    f"{result['steps_per_s']:.2f} steps/s",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        "| threads | base steps/s (each round) | new steps/s (each round) | ratio of medians | "
        "ratio by CPU time |"
    )
    print("|---|---|---|---|---|")
    for threads in args.threads:
        cells = []
        for name in ("base", "new"):
            rates = [r["steps_per_s"] for r in runs[name, threads]]
            cells.append(f"{statistics.median(rates):.2f} ({', '.join(f'{x:.2f}' for x in rates)})")
        wall, cpu = (
            statistics.median(r[key] for r in runs["new", threads])
            / statistics.median(r[key] for r in runs["base", threads])
            for key in ("steps_per_s", "steps_per_cpu_s")
        )
        used = [runs[name, threads][0]["torch_threads"] for name in ("base", "new")]
        label = f"{threads}" if threads else f"default (base/new: {used[0]}/{used[1]})"
        # process CPU time counts every thread: a rate per CPU second compares one thread only
        by_cpu = f"{cpu:.2f}x" if used == [1, 1] else "-"
        print(f"| {label} | {cells[0]} | {cells[1]} | {wall:.2f}x | {by_cpu} |")
    for threads in args.threads:
        print(f"\nStage medians, ms (median over rounds), threads {threads or 'default'}:\n")
        print("| stage | base | new |")
        print("|---|---:|---:|")
        for stage in (*STAGES, "step"):
            cells = []
            for name in ("base", "new"):
                key = "median_step_ms" if stage == "step" else None
                values = [r[key] if key else r["median_ms"][stage] for r in runs[name, threads]]
                cells.append(f"{statistics.median(values):.2f}")
            print(f"| {stage} | {' | '.join(cells)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}-{k[1]}": v for k, v in runs.items()}))


def _alternating(
    trainer: Any,
    phase: int,
    steps: int,
    sides: tuple[str, str],
    choose: Callable[[str], None],
    on_start: Callable[[], None],
) -> tuple[int, dict[str, list[float]]]:
    """``trainer`` trained on to step ``phase`` on the first side (a phase already passed starts
    where the last one ended), ``on_start()``, then ``steps`` steps of each side, alternating step
    by step so that the machine's drift falls on both alike (``choose(side)`` switches): the first
    step timed and each side's milliseconds."""
    choose(sides[0])
    while trainer.step < phase:
        _step_ms(trainer)
    on_start()
    start = trainer.step
    times: dict[str, list[float]] = {side: [] for side in sides}
    for index in range(2 * steps):
        side = sides[index % 2]
        choose(side)
        times[side].append(_step_ms(trainer))
    return start, times


def _rollout_sides(
    args: argparse.Namespace,
    trainer: Any,
    sides: tuple[str, str],
    choose: Callable[[str], None],
    timing: str,
) -> None:
    """Steps alternating between ``sides`` (``choose(side)`` switches) from each of ``--phases``,
    printed as a table with each side's median ``timing`` (a ``RolloutTimings`` field) of its
    rollouts beside its step times."""
    from raptb.adapters.lm import rollout as rollout_module

    current = [sides[0]]
    # each side's rollout milliseconds, from the first timed step
    rollouts: dict[str, list[float]] = {side: [] for side in sides}

    def on_start() -> None:
        for times in rollouts.values():
            times.clear()

    def switch(side: str) -> None:
        current[0] = side
        choose(side)

    def timed(*call: Any, **kwargs: Any) -> Any:
        rollout = rollout_module.sample_rollout(trainer.policy, *call, **kwargs)
        rollouts[current[0]].append(1000 * getattr(rollout.timings, timing))
        return rollout

    trainer.policy.sample = timed
    first, second = sides
    print(
        f"| from step | {timing} ms, {first} (median) | {timing} ms, {second} (median) | ratio | "
        f"ms/step, {first} (median; mean) | ms/step, {second} (median; mean) | ratio of medians |"
    )
    print("|---:|---:|---:|---:|---|---|---:|")
    for phase in args.phases:
        start, times = _alternating(trainer, phase, args.steps, sides, switch, on_start)
        roll = [statistics.median(rollouts[side]) for side in sides]
        medians = [statistics.median(times[side]) for side in sides]
        means = [statistics.mean(times[side]) for side in sides]
        print(
            f"| {start} | {roll[0]:.2f} | {roll[1]:.2f} | {roll[1] / roll[0]:.2f}x | "
            f"{medians[0]:.1f}; {means[0]:.1f} | {medians[1]:.1f}; {means[1]:.1f} | "
            f"{medians[1] / medians[0]:.3f}x |",
            flush=True,
        )


def decode(args: argparse.Namespace) -> None:
    """The compiled rollout against torch's eager loop, alternating in one trainer."""
    trainer = _loss_trainer(args)

    def choose(side: str) -> None:
        trainer.policy.decode = side

    _rollout_sides(args, trainer, ("compiled", "eager"), choose, "total_s")


def grammar(args: argparse.Namespace) -> None:
    """The rollout's masks from the task's automaton table against xgrammar's matchers,
    alternating in one trainer."""
    trainer = _loss_trainer(args)
    automaton = trainer.policy.automaton
    if automaton is None:
        raise SystemExit(f"task {args.task!r} declares no automaton")

    def choose(side: str) -> None:
        trainer.policy.automaton = automaton if side == "table" else None

    _rollout_sides(args, trainer, ("table", "matchers"), choose, "grammar_s")


def adamw(args: argparse.Namespace) -> None:
    """AdamW's fused update against the multi-tensor one, alternating in one trainer (the
    optimizer's state handed over at each switch, outside the timed steps)."""
    import torch

    trainer = _loss_trainer(args)
    groups = [dict(group) for group in trainer.optimizer.param_groups]
    optimizers = {
        "fused": trainer.optimizer,
        "foreach": torch.optim.AdamW(groups, foreach=True),
    }
    assert trainer.optimizer.defaults["fused"]

    def choose(side: str) -> None:
        if trainer.optimizer is not optimizers[side]:
            optimizers[side].load_state_dict(trainer.optimizer.state_dict())
            trainer.optimizer = optimizers[side]

    _step_sides(args, trainer, ("fused", "foreach"), choose)


def _step_sides(
    args: argparse.Namespace, trainer: Any, sides: tuple[str, str], choose: Callable[[str], None]
) -> None:
    """Steps alternating between ``sides`` (``choose(side)`` switches) from each of ``--phases``,
    printed as a table of each side's step times."""
    first, second = sides
    print(
        f"| from step | ms/step, {first} (median; mean) | ms/step, {second} (median; mean) | "
        "ratio |"
    )
    print("|---:|---|---|---:|")
    for phase in args.phases:
        start, times = _alternating(trainer, phase, args.steps, sides, choose, lambda: None)
        medians = [statistics.median(times[side]) for side in sides]
        means = [statistics.mean(times[side]) for side in sides]
        print(
            f"| {start} | {medians[0]:.2f}; {means[0]:.2f} | {medians[1]:.2f}; {means[1]:.2f} | "
            f"{medians[1] / medians[0]:.3f}x |",
            flush=True,
        )


def threads(args: argparse.Namespace) -> None:
    """The main job's step on two torch threads and on one (``torch.set_num_threads``),
    alternating step by step in one trainer: whether a second thread pays."""
    import torch

    trainer = _loss_trainer(args)
    sides = ("two threads", "one thread")
    _step_sides(
        args, trainer, sides, lambda side: torch.set_num_threads(2 if side == sides[0] else 1)
    )


SIZES = ((64, 2, None), (128, 4, None), (256, 6, None), (512, 8, None), (256, 6, 50257))
"""``sizes``' GPT-2 shapes: width, layers, vocabulary (None: the embedded model's characters)."""


def sizes(args: argparse.Namespace) -> None:
    """A rollout of 34 rows and 9 columns compiled and eagerly, GPT-2 models of growing size
    (random weights, no grammar), the two alternating: where ``decode = "auto"`` should stop
    taking the compiled path (``compiled_rollout.AUTO_MAX_PARAMETERS``)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from raptb.adapters.lm.models import build_char_tokenizer
    from raptb.adapters.lm.policy import HFPolicy
    from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id

    torch.set_num_threads(args.threads[0] or torch.get_num_threads())
    tokenizer = build_char_tokenizer()
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, "123456789+-*/", stop_id=stop)
    print(
        "| width | layers | vocabulary | parameters | compiled ms (median) | eager ms (median) | "
        "ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for width, layers, vocab in SIZES:
        config = GPT2Config(
            vocab_size=vocab or len(tokenizer), n_positions=128, n_embd=width, n_layer=layers,
            n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
            activation_function="gelu_pytorch_tanh", eos_token_id=None, bos_token_id=None,
        )  # fmt: skip
        policy = HFPolicy(GPT2LMHeadModel(config).eval(), tokenizer, legal_ids=legal, stop_id=stop)
        times: dict[str, list[float]] = {"compiled": [], "eager": []}
        for index in range(2 * args.rounds):
            path = ("compiled", "eager")[index % 2]
            policy.decode = path
            generator = torch.Generator().manual_seed(index // 2)
            tic = time.perf_counter()
            policy.sample("Make 24:", 34, min_length=9, max_length=9, generator=generator)
            times[path].append(1000 * (time.perf_counter() - tic))
        compiled, eager = (statistics.median(times[p]) for p in ("compiled", "eager"))
        count = sum(p.numel() for p in policy.model.parameters())
        print(
            f"| {width} | {layers} | {vocab or len(tokenizer)} | {count / 1e6:.2f}M | "
            f"{compiled:.1f} | {eager:.1f} | {eager / compiled:.2f}x |",
            flush=True,
        )


def _loss_trainer(args: argparse.Namespace) -> Any:
    """The main job's trainer with ``--loss`` (a GFlowNet objective with SubM, else the RL
    loss's own defaults) on ``--task``, seed ``--seed``, ``--threads``."""
    from rich.console import Console

    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer
    from raptb.core.gfn.objectives import OBJECTIVES

    overrides: dict[str, Any] = {"task": args.task, "loss": args.loss}
    if args.loss in OBJECTIVES:  # a GFlowNet objective: the main job's replay
        overrides["replay.kind"] = "subm"
    cfg = build_config(None, overrides | {"seed": args.seed, "threads": args.threads[0] or None})
    quiet = Console(stderr=True, quiet=True)
    return Trainer(cfg, Path(tempfile.mkdtemp()), progress=False, console=quiet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ["profile", "ab", "floor", "decode", "grammar", "sizes"]
    modes += ["adamw", "threads", "interleave", "serve"]
    parser.add_argument("mode", choices=modes)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base-python", default=None)
    parser.add_argument("--base-root", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--rolled-out", type=int, default=40, help="floor: rows rolled out")
    parser.add_argument("--phases", type=int, nargs="+", default=[30, 1000, 2500])
    parser.add_argument("--blocks", type=int, default=40, help="interleave: turns per side")
    parser.add_argument("--block", type=int, default=10, help="interleave: steps per turn")
    parser.add_argument(
        "--loss", default="raptb", help="decode: the loss (GFlowNet ones with SubM)"
    )
    parser.add_argument("--task", default="expr24", help="decode: the task")
    args = parser.parse_args()
    if args.mode == "floor":
        for shared in (False, True):
            record = floor(128, args.rolled_out, 8, 9, args.steps, shared)
            print(json.dumps({"prompt_once": shared, **record}))
    elif args.mode == "decode":
        decode(args)
    elif args.mode == "grammar":
        grammar(args)
    elif args.mode == "adamw":
        adamw(args)
    elif args.mode == "threads":
        threads(args)
    elif args.mode == "sizes":
        sizes(args)
    elif args.mode == "serve":
        serve(args.seed, args.threads[0], args.warmup)
    elif args.mode == "interleave":
        interleave(args)
    elif args.mode == "profile":
        print(json.dumps(measure(args.seed, args.threads[0], args.warmup, args.steps)))
    else:
        ab(args)


if __name__ == "__main__":
    main()
