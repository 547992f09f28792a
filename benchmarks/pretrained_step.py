"""A pretrained model's training step, stage by stage, against another checkout, interleaved.

Usage (from the repository root; BASE a checkout of the commit to compare with, with its own
environment at BASE/.venv, as ``git worktree add`` and an editable install make it):

    python benchmarks/pretrained_step.py --base BASE [--tasks smiles expr24] [--steps 3]
        [--warmup 1] [--threads 1] [--model smollm2-135m] [--out benchmarks/pretrained_step.md]

For each task, two worker processes build the same trainer (``--model`` with the task's pretrained
preset: LoRA r16, kappa 1; 32 rows a step, all on-policy, as ``benchmarks/train_step.py
--optimizer-steps``), one on this checkout's code and one on BASE's, and take optimizer steps in
turn, one at a time (the side that goes first alternates), so both see the same machine load.
Each step is timed by ``train_step.timed_optimizer_step``'s stages, in CPU seconds of the process
(``time.process_time``: on a machine other jobs share, the wall time of a stage counts the time
it waited for a core; its CPU time does not) and the step's wall seconds beside them. After the
timed steps each worker counts one more step's floating-point operations (torch's
``FlopCounterMode``: matrix products and attention, forward and backward). Prints a markdown table
(medians over the timed steps) and writes it to ``--out`` when given.

The dtype arm (``model_dtype``, adapters/lm/precision.py), in one process:

    python benchmarks/pretrained_step.py --dtypes [--tasks smiles expr24] [--steps 5]
        [--warmup 1] [--threads 1] [--model smollm2-135m] [--out FILE]

builds the task's policy twice (LoRA r16, dropout 0, its B weights drawn so the adapters change
every logit, the same adapter weights in both), float32 and bfloat16 base weights, and repeats,
the two in turn (the side that goes first alternating): a rollout of 32 rows (each its own, from
the same seed), then on one fixed set of 32 rows (the float32 rollout's) the reference pass and
the teacher-forced rescoring forward and backward of RapTB's loss. Stages in CPU seconds of the
process; then how far bfloat16's numbers are from float32's on those rows: the sequence
log-probabilities, the loss, the cosine of the LoRA gradients.
"""

from __future__ import annotations

import argparse
import datetime
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


def worker(args: argparse.Namespace) -> None:
    """Build the trainer, answer each ``step`` line on stdin with one step's times (JSON)."""
    sys.path.insert(0, str(Path(args.tree) / "benchmarks"))
    import torch
    import train_step  # the checkout's own (its stages as that code runs them)
    from torch.utils.flop_counter import FlopCounterMode

    from raptb.adapters.lm.threads import use_threads
    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    use_threads(args.threads)
    ns = argparse.Namespace(
        batch_size=32, grad_accum=1, replay="subm", task=args.task, kappa=None, length=10
    )
    cfg = build_config(overrides=train_step.step_overrides(ns, args.model))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp()) / "run", progress=False)
    torch.manual_seed(0)
    # the stages on the process's CPU clock; the step's wall time beside them
    train_step.time = types.SimpleNamespace(perf_counter=time.process_time)
    print(json.dumps({"ready": True, "decode": trainer.policy.decode_path}), flush=True)
    for line in sys.stdin:
        if line.strip() == "flops":
            with FlopCounterMode(display=False) as counter:
                train_step.timed_optimizer_step(trainer)
            print(json.dumps({"flops": counter.get_total_flops()}), flush=True)
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


def _dtype_policies(args: argparse.Namespace, task_name: str) -> tuple[Any, list[Any]]:
    """The task and its policy on ``--model`` in float32 and in bfloat16 (the same LoRA r16
    adapters, B drawn, dropout 0)."""
    import torch

    from raptb.app.configuration.config import build_config
    from raptb.app.task_and_policy import build_policy, build_task

    cfg = build_config(overrides={"model": args.model, "task": task_name, "lora.dropout": 0.0})
    task = build_task(cfg)
    cpu = torch.device("cpu")
    policies = [
        build_policy(cfg.model, task, 0, lora=cfg.lora, device=cpu, dtype=dtype)
        for dtype in ("float32", "bfloat16")
    ]
    torch.manual_seed(0)
    with torch.no_grad():
        drawn = {}
        for name, param in policies[0].model.named_parameters():
            if "lora_B" in name:
                drawn[name] = param.normal_(0.0, 0.02).clone()
        for name, param in policies[1].model.named_parameters():
            if name in drawn:
                param.copy_(drawn[name])
    return task, policies


def dtype_arm(args: argparse.Namespace, task_name: str) -> list[str]:
    """``--dtypes``: float32 against bfloat16 base weights on one task, in this process."""
    import torch

    from raptb.adapters.lm.policy import to_prefix_batch
    from raptb.adapters.lm.threads import use_threads
    from raptb.core.gfn.objectives import objective_by_name

    use_threads(args.threads)
    task, policies = _dtype_policies(args, task_name)
    prompt = task.prompts()[0]
    limits = {"min_length": task.min_length, "max_length": task.max_length}
    fixed = policies[0].sample(prompt, 32, generator=torch.Generator().manual_seed(1), **limits)
    rows = torch.arange(32)
    u = torch.randn(32, fixed.tokens.shape[1] + 1, generator=torch.Generator().manual_seed(2))
    objective = objective_by_name("raptb")

    def stages(policy: Any) -> tuple[dict[str, float], dict[str, Any]]:
        times: dict[str, float] = {}
        start = time.process_time()
        policy.sample(prompt, 32, generator=torch.Generator().manual_seed(3), **limits)
        times["rollout (its own rows)"] = time.process_time() - start
        start = time.process_time()
        policy.reference_score(prompt, fixed.tokens, fixed.length)
        times["reference pass"] = time.process_time() - start
        policy.model.train()
        policy.model.zero_grad(set_to_none=True)
        start = time.process_time()
        log_pf, log_pterm = policy.score(prompt, fixed.tokens, fixed.length)
        batch = to_prefix_batch(log_pf, log_pterm, u * 10.0 + log_pterm.detach(), u, fixed.length)
        loss, _ = objective(batch, 0.0)
        loss.backward()
        times["rescoring forward + backward"] = time.process_time() - start
        times["total"] = sum(times.values())
        grads = [p.grad.flatten() for n, p in policy.model.named_parameters() if "lora_" in n]
        sequence = log_pf.sum(dim=1) + log_pterm[rows, fixed.length]
        kept = {"sequence": sequence.detach(), "loss": float(loss.detach())}
        kept["grad"] = torch.cat(grads)
        kept["grad dtypes"] = sorted({str(g.dtype) for g in grads})
        return times, kept

    runs: list[list[dict[str, float]]] = [[], []]
    kept: list[dict[str, Any]] = [{}, {}]
    for i in range(args.warmup + args.steps):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            times, kept[side] = stages(policies[side])
            if i >= args.warmup:
                runs[side].append(times)
            name = ("float32", "bfloat16")[side]
            print(f"{task_name} {name} repeat {i}: {times}", file=sys.stderr, flush=True)
    full, half = runs
    lines = [f"| {task_name}: stage | float32 CPU s | bfloat16 CPU s | float32 / bfloat16 |"]
    lines.append("|---|---|---|---|")
    for key in full[0]:
        a = statistics.median(r[key] for r in full)
        b = statistics.median(r[key] for r in half)
        lines.append(f"| {key} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    want, got = kept
    gap = (got["sequence"] - want["sequence"]).abs()
    # in float64: a float32 cosine over the ~5M LoRA gradients read 1.001 on a quiet run
    cosine = torch.nn.functional.cosine_similarity(
        got["grad"].double(), want["grad"].double(), dim=0
    )
    lines.append(
        f"\nOn the same 32 rows (lengths {sorted(set(fixed.length.tolist()))}): sequence "
        f"log-probabilities max |diff| {float(gap.max()):.3f} (mean |log p| "
        f"{float(want['sequence'].abs().mean()):.1f}); RapTB loss {want['loss']:.4g} against "
        f"{got['loss']:.4g} (relative {abs(got['loss'] / want['loss'] - 1):.1e}); "
        f"LoRA gradients' cosine {float(cosine):.5f}, bfloat16's dtypes {got['grad dtypes']}; "
        f"totals float32 {[round(r['total'], 2) for r in full]}, bfloat16 "
        f"{[round(r['total'], 2) for r in half]} CPU s\n"
    )
    return lines


class Side:
    """A worker process of one checkout."""

    def __init__(self, name: str, tree: Path, args: argparse.Namespace, task: str) -> None:
        python = tree / ".venv" / "bin" / "python"
        command = [str(python), str(Path(__file__).resolve()), "--worker", "--tree", str(tree)]
        command += ["--task", task, "--threads", str(args.threads), "--model", args.model]
        env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1"}
        self.name = name
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
    """The interleaved steps of both checkouts on ``task``: table rows."""
    sides = [
        Side("base", Path(args.base).resolve(), args, task),
        Side("new", HERE.parent, args, task),
    ]
    for i in range(args.warmup + args.steps):
        for side in sides if i % 2 == 0 else sides[::-1]:
            result = side.ask("step")
            if i >= args.warmup:
                side.runs.append(result)
            print(
                f"{task} {side.name} step {i}: wall {result['wall']:.1f} s, "
                f"cpu {result['cpu']['total']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    flops = [side.ask("flops")["flops"] for side in sides]
    for side in sides:
        side.close()
    base, new = sides
    rows = [f"| {task}: stage | base CPU s | new CPU s | base / new |", "|---|---|---|---|"]
    for key in base.runs[0]["cpu"]:
        b = statistics.median(r["cpu"][key] for r in base.runs)
        n = statistics.median(r["cpu"][key] for r in new.runs)
        rows.append(f"| {key} | {b:.2f} | {n:.2f} | {b / n if n else float('nan'):.2f}x |")
    b = statistics.median(r["wall"] for r in base.runs)
    n = statistics.median(r["wall"] for r in new.runs)
    rows.append(f"| wall | {b:.2f} | {n:.2f} | {b / n:.2f}x |")
    rows.append(
        f"| step TFLOP (counted) | {flops[0] / 1e12:.3f} | {flops[1] / 1e12:.3f} | "
        f"{flops[0] / flops[1]:.2f}x |"
    )
    tokens = [statistics.median(r["tokens"] for r in side.runs) for side in sides]
    rows.append(f"| generated tokens a step | {tokens[0]:.0f} | {tokens[1]:.0f} | |")
    rows.append(
        f"\ndecode paths: base {base.ready['decode']}, new {new.ready['decode']}; "
        f"steps base {[round(r['cpu']['total'], 2) for r in base.runs]}, "
        f"new {[round(r['cpu']['total'], 2) for r in new.runs]} CPU s\n"
    )
    return rows


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None)
    parser.add_argument("--tasks", nargs="+", default=["smiles", "expr24"])
    parser.add_argument("--task", default=None)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
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
    if args.base is None and not args.dtypes:
        raise SystemExit("--base: give a checkout to compare with (with its .venv), or --dtypes")
    load = os.getloadavg()
    lines = [
        f"Command: `python benchmarks/pretrained_step.py {' '.join(sys.argv[1:])}`; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; CPU {cpu_model()}, "
        f"{os.cpu_count()} cores; {args.model}, 32 rows a step, {args.threads} thread(s); load "
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
