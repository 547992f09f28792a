"""A pretrained model's training step, stage by stage, against another checkout, interleaved.

Usage (from the repository root; BASE a checkout of the commit to compare with, with its own
environment at BASE/.venv, as ``git worktree add`` and an editable install make it):

    python benchmarks/pretrained_step.py --base BASE [--tasks smiles expr24] [--steps 3]
        [--warmup 1] [--threads 1] [--model smollm2-135m] [--grad-accum 1] [--clock cpu]
        [--floor GFLOPS] [--out benchmarks/pretrained_step.md]
    python benchmarks/pretrained_step.py --against-threads 2 [--threads 1] --clock wall ...
    python benchmarks/pretrained_step.py --alone [--threads 1] --clock wall --floor GFLOPS ...

For each task, two worker processes build the same trainer (``--model`` with the task's pretrained
preset: LoRA r16, kappa 1; 32 x ``--grad-accum`` rows a step, rolled out together and rescored in
micro-batches of 32, all on-policy, as ``benchmarks/train_step.py --optimizer-steps``), one on
this checkout's code and one on BASE's (or, with ``--against-threads`` and no BASE, both on this
checkout, one on ``--threads`` and one on that many), and take optimizer steps in turn, one at a
time (the side that goes first alternates), so both see the same machine load. Each step is
timed by ``train_step.timed_optimizer_step``'s stages, in CPU seconds of the process (a stage's
wall time would count its waits for a core on a shared machine; ``--clock wall`` for thread
counts compared) and the step's wall seconds beside them. After the timed steps each worker
counts one more step's floating-point operations by stage (torch's ``FlopCounterMode``; the
stages' boundaries read its running total). Two processes of ~2.5 GB taking turns can slow each
other down on a virtual machine (the preset's Expr24 step: 34 s interleaved, 23 s alone):
``--alone`` runs one process, for the absolute seconds a floor is compared with. With
``--floor`` (GFLOP/s a thread, ``benchmarks/floor.py``'s) each stage's seconds are divided by its
floor; with ``--product-floor`` (``--clock wall``, this checkout only) by its products' seconds
alone, each timed at its own shape in the worker after the timed steps (``shape_floor.py``;
``--product-floor memory``: each product's operands read from memory, not from the caches).
Prints a markdown table (medians over the timed steps) and writes it to ``--out`` when given.

The dtype arm, float32 against bfloat16, is ``--dtypes`` (``pretrained_dtypes.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _reading(products: Any, counter: Any, rate: float) -> complex:
    """The FLOPs ``counter`` counted so far and, under ``products`` (a ``ProductFloor``), the
    products' seconds alone so far with the other counted FLOPs at ``rate`` FLOP/s."""
    flops = counter.get_total_flops()
    if products is None:
        return complex(flops, 0.0)
    return complex(flops, products.seconds + (flops - products.flops) / rate)


def worker(args: argparse.Namespace) -> None:
    """Build the trainer, answer each ``step`` line on stdin with one step's times (JSON)."""
    sys.path.insert(0, str(Path(args.tree) / "benchmarks"))
    import torch
    import train_step  # the checkout's own (its stages as that code runs them)
    from torch.utils.flop_counter import FlopCounterMode

    from raptb.adapters.lm.lanes import Lanes
    from raptb.adapters.lm.threads import use_threads
    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    use_threads(args.threads)
    ns = argparse.Namespace(
        batch_size=32,
        grad_accum=args.grad_accum,
        replay="subm",
        task=args.task,
        kappa=None,
        length=10,
    )
    cfg = build_config(overrides=train_step.step_overrides(ns, args.model))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp()) / "run", progress=False)
    torch.manual_seed(0)
    # the stages on the process's CPU clock (or the wall clock); the step's wall time beside them
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    train_step.time = types.SimpleNamespace(perf_counter=clock)
    print(json.dumps({"ready": True, "decode": trainer.policy.decode_path}), flush=True)
    for line in sys.stdin:
        if line.strip() in ("flops", "flops+floor", "flops+floor:memory"):
            # the stages' boundaries read one complex number: the FLOPs counted so far (real part)
            # and, for the floor, the products' seconds alone so far with the rest of the counted
            # FLOPs (attention) at the square product's rate (imaginary part; shape_floor.py):
            # one step gives both by stage
            from shape_floor import ProductFloor, square_rate

            floor = line.strip().startswith("flops+floor")
            from_memory = line.strip().endswith(":memory")  # operands read from memory
            # torch's dispatch modes see their own thread only: the counted step runs in one lane
            # (the same work, so the same FLOPs; its seconds are not the ones reported)
            lanes, trainer.policy.lanes = trainer.policy.lanes, Lanes(1)
            rate = square_rate() if floor else 1.0  # measured before anything is counted
            with ProductFloor(from_memory) if floor else contextlib.nullcontext() as products:
                with FlopCounterMode(display=False) as counter:
                    train_step.time = types.SimpleNamespace(
                        perf_counter=functools.partial(_reading, products, counter, rate)
                    )
                    stages, _ = train_step.timed_optimizer_step(trainer)
                    train_step.time = types.SimpleNamespace(perf_counter=clock)
            trainer.policy.lanes = lanes
            counted = {"flops": counter.get_total_flops()}
            counted["stages"] = {key: value.real for key, value in stages.items()}
            if floor:
                counted["floor"] = {key: value.imag for key, value in stages.items()}
            print(json.dumps(counted), flush=True)
            continue
        start = time.perf_counter()
        parts, tokens = train_step.timed_optimizer_step(trainer)
        wall = time.perf_counter() - start
        print(json.dumps({"cpu": parts, "wall": wall, "tokens": tokens}), flush=True)


def check(args: argparse.Namespace) -> str:
    """``--check``: the shared-prompt rescoring and reference pass against the model's own forward
    over every row (the path of a model sharded across processes, ``step_together`` set on this
    one process; adapters/lm/paths.py) on ``--model`` with LoRA r16 (its B weights
    drawn, so the adapters change every logit), 32 rows of the first task's prompt: the largest
    differences of the log-probabilities and of the LoRA gradients."""
    import torch

    from raptb.adapters.lm.threads import use_threads
    from raptb.app.configuration.config import build_config
    from raptb.app.task_and_policy import build_policy, build_task

    use_threads(args.threads)
    task_name = args.tasks[0]
    overrides = {"model": args.model, "task": task_name, "lora.dropout": 0.0}
    cfg = build_config(overrides=overrides)  # no dropout: one function on both paths
    task = build_task(cfg)
    policy = build_policy(cfg.model, task, 0, lora=cfg.lora, device=torch.device("cpu"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    prompt = task.prompts()[0]
    rollout = policy.sample(prompt, 32, min_length=task.min_length, max_length=task.max_length)
    policy.model.train()
    results = []
    for shared in (True, False):
        policy.step_together = None if shared else (lambda done: done)
        policy.model.zero_grad(set_to_none=True)
        log_pf, log_pterm = policy.score(prompt, rollout.tokens, rollout.length)
        (log_pf.sum() + log_pterm.sum()).backward()
        grads = [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]
        ref = policy.reference_score(prompt, rollout.tokens, rollout.length)
        results.append((log_pf.detach(), log_pterm.detach(), grads, ref))
    (pf, pt, g, ref), (pf0, pt0, g0, ref0) = results
    gap = max(float((a - b).abs().max()) for a, b in zip(g, g0, strict=True))
    scale = max(float(b.abs().max()) for b in g0)
    values = max(
        float((a - b).abs().max()) for a, b in zip((pf, pt, *ref), (pf0, pt0, *ref0), strict=True)
    )
    return (
        f"{args.model} + LoRA r16 (dropout 0, training mode), {task_name}, 32 rows of lengths "
        f"{sorted(set(rollout.length.tolist()))}: shared prompts against every row's forward, "
        f"log-probs (rescoring and reference) max |diff| {values:.2e}; LoRA gradients max "
        f"|diff| {gap:.2e} (largest gradient {scale:.2e})"
    )


class Side:
    """A worker process of one checkout."""

    def __init__(
        self, name: str, tree: Path, args: argparse.Namespace, task: str, threads: int
    ) -> None:
        python = tree / ".venv" / "bin" / "python"
        if not python.exists():
            python = Path(sys.executable)  # this checkout run from its own environment
        command = [str(python), str(Path(__file__).resolve()), "--worker", "--tree", str(tree)]
        command += ["--task", task, "--threads", str(threads), "--model", args.model]
        command += ["--grad-accum", str(args.grad_accum), "--clock", args.clock]
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
        self.name, self.threads = name, threads
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree
        )
        self.runs: list[dict[str, Any]] = []
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"{self.name}: the worker stopped")

    def ask(self, what: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def compare(args: argparse.Namespace, task: str) -> list[str]:
    """The interleaved steps of both sides on ``task`` (BASE's checkout and this one, or this one
    on ``--threads`` and on ``--against-threads``), or of this checkout alone (``--alone``): table
    rows."""
    here = HERE.parent
    if args.base is not None:
        sides = [
            Side("base", Path(args.base).resolve(), args, task, args.threads),
            Side("new", here, args, task, args.threads),
        ]
    else:  # this checkout on --threads, then on --against-threads, or alone
        counts = [args.threads] + ([args.against_threads] if args.against_threads else [])
        sides = [Side(f"{t} thread{'s' if t > 1 else ''}", here, args, task, t) for t in counts]
    for i in range(args.warmup + args.steps):
        for side in sides if i % 2 == 0 else sides[::-1]:
            result = side.ask("step")
            if i >= args.warmup:
                side.runs.append(result)
            print(
                f"{task} {side.name} step {i}: wall {result['wall']:.1f} s, "
                f"{args.clock} {result['cpu']['total']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    ask = {None: "flops", "cache": "flops+floor", "memory": "flops+floor:memory"}
    counted = [side.ask(ask[args.product_floor]) for side in sides]
    for side in sides:
        side.close()
    return table(args, task, sides, counted)


def table(
    args: argparse.Namespace, task: str, sides: list[Side], counted: list[dict[str, Any]]
) -> list[str]:
    """The markdown rows of ``compare``: each stage's median seconds on each side (one or two),
    the first's over the second's, its counted GFLOP (each side's, "base / new", where the two
    sides' differ) and, with ``--floor``, each side's seconds over the stage's floor on that side
    (its GFLOP at ``--floor`` GFLOP/s a thread; per CPU second, or per wall second times the
    side's threads with ``--clock wall``) and, with ``--product-floor``, over
    its products' seconds alone on that side (``counted[i]["floor"]``)."""
    unit = "CPU s" if args.clock == "cpu" else "wall s"
    pair = len(sides) == 2
    head = f"| {task}: stage |" + "".join(f" {side.name} {unit} |" for side in sides)
    head += (" ratio |" if pair else "") + " GFLOP |"
    if args.floor:
        head += "".join(f" {side.name} / floor |" for side in sides)
    if args.product_floor:
        floor = "product floor" + (", from memory" if args.product_floor == "memory" else "")
        head += "".join(f" {side.name} / {floor} |" for side in sides)
    rows = [head, "|---" * head.count(" |") + "|"]
    floors = (len(sides) if args.floor else 0) + (len(sides) if args.product_floor else 0)
    blank = " |" * (floors + 1)  # GFLOP and floor cells left empty

    def medians(key: str) -> list[float]:
        return [statistics.median(r["cpu"][key] for r in side.runs) for side in sides]

    def ratio(values: list[float]) -> str:
        return f" {values[0] / values[1] if values[1] else float('nan'):.2f}x |" if pair else ""

    for key in sides[0].runs[0]["cpu"]:
        seconds = medians(key)
        each = [count["stages"].get(key, 0.0) for count in counted]  # each side's own work
        row = f"| {key} |" + "".join(f" {x:.2f} |" for x in seconds) + ratio(seconds)
        if max(each) <= 1e9:
            rows.append(row + blank)
            continue
        same = max(each) - min(each) <= 0.005 * max(each)
        row += (
            f" {each[-1] / 1e9:.1f} |"
            if same
            else f" {' / '.join(f'{f / 1e9:.1f}' for f in each)} |"
        )
        for side, x, flops in zip(sides, seconds, each, strict=True) if args.floor else ():
            rate = args.floor * 1e9 * (side.threads if args.clock == "wall" else 1)
            row += f" {x / (flops / rate):.2f}x |"
        for count, x in zip(counted, seconds, strict=True) if args.product_floor else ():
            row += f" {x / count['floor'][key]:.2f}x |"
        rows.append(row)
    walls = [statistics.median(r["wall"] for r in side.runs) for side in sides]
    rows.append("| wall |" + "".join(f" {x:.2f} |" for x in walls) + ratio(walls) + blank)
    flops = [c["flops"] for c in counted]
    rows.append(
        "| step TFLOP (counted) |"
        + "".join(f" {x / 1e12:.3f} |" for x in flops)
        + ratio(flops)
        + blank
    )
    tokens = [statistics.median(r["tokens"] for r in side.runs) for side in sides]
    rows.append(
        "| generated tokens a step |"
        + "".join(f" {x:.0f} |" for x in tokens)
        + (" |" if pair else "")
        + blank
    )
    paths = ", ".join(f"{side.name} {side.ready['decode']}" for side in sides)
    steps = ", ".join(
        f"{side.name} {[round(r['cpu']['total'], 2) for r in side.runs]}" for side in sides
    )
    rows.append(f"\ndecode paths: {paths}; steps {steps} {unit}\n")
    return rows


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    sys.path.insert(0, str(HERE))
    from pretrained_dtypes import dtype_arm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None)
    parser.add_argument("--tasks", nargs="+", default=["smiles", "expr24"])
    parser.add_argument("--task", default=None)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--against-threads",
        type=int,
        default=None,
        help="without --base: this checkout on --threads against this many threads",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="this checkout on --threads in one process, nothing interleaved (absolute seconds)",
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches of 32 rows a step, rolled out together (the SMILES preset: 4)",
    )
    parser.add_argument(
        "--clock", choices=["cpu", "wall"], default="cpu", help="the stages' seconds"
    )
    parser.add_argument(
        "--product-floor",
        nargs="?",
        const="cache",
        choices=["cache", "memory"],
        help="each stage's seconds over its products' seconds alone at their own shapes "
        "(shape_floor.py), measured in each worker after the timed steps; 'memory': each "
        "product's operands read from memory, as a step reads its weights",
    )
    parser.add_argument(
        "--floor",
        type=float,
        default=None,
        help="GFLOP/s a thread (benchmarks/floor.py's): each stage's seconds over its floor",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--dtypes", action="store_true", help="float32 against bfloat16")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.check:
        print(check(args))
        return
    if args.base is None and args.against_threads is None and not (args.dtypes or args.alone):
        raise SystemExit(
            "--base: give a checkout to compare with (with its .venv), or --against-threads N, "
            "--alone or --dtypes"
        )
    if args.product_floor and (args.base is not None or args.clock != "wall"):
        raise SystemExit(
            "--product-floor: this checkout's workers only, on --clock wall (drop --base, add "
            "--clock wall)"
        )
    load = os.getloadavg()
    lines = [
        f"Command: `python benchmarks/pretrained_step.py {' '.join(sys.argv[1:])}`; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; CPU {cpu_model()}, "
        f"{os.cpu_count()} cores; {args.model}, {32 * args.grad_accum} rows a step (micro-batches "
        f"of 32), {args.threads} thread(s); load "
        f"average at the start {load[0]:.1f}.\n"
    ]
    for task in args.tasks:
        lines += dtype_arm(args, task) if args.dtypes else compare(args, task)
    lines.append(f"Load average at the end {os.getloadavg()[0]:.1f}.")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
