"""Throughput on CPU: 1 process vs 2 processes data-parallel (DDP-style) vs 2 processes fully
sharded (FSDP2), the same global batch; and the model state each rank holds.

Usage (from the repository root, in the environment raptb is installed in):

    python benchmarks/scaling.py [--steps 8] [--warmup 2] [--batch-size 16] [--rounds 2]
        [--model tiny] [--lora-rank 0] [--memory]

Each round trains the default Expr24 run (RapTB, SubM replay) once as a plain ``raptb train``,
once under ``accelerate launch`` with 2 CPU processes (gloo), and twice with the FSDP config
(configs/accelerate/fsdp_cpu_2proc.yaml: parameters freed after every forward, and kept gathered
until the backward with ``--fsdp_reshard_after_forward false``), one thread per process, in
rotating order, so all see the same machine load. ``batch_size`` is the global micro-batch, so
all train on the same number of trajectories per step. Steps/s come from the per-step
``seconds`` that rank 0 logs in metrics.jsonl (rollout to optimizer step, collectives included;
process start-up excluded), after ``--warmup`` steps.

``--memory`` adds the bytes of model state per rank after one optimizer step (parameters,
gradients and optimizer states as stored on that rank: whole under data parallelism, the
rank's shards under FSDP), counted from the tensors themselves in 2 spawned ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
FSDP = [*ACCELERATE, "--config_file", str(ROOT / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml")]
LAUNCH: dict[str, list[str] | None] = {
    "1 process": None,
    "2 processes, data-parallel": [
        *ACCELERATE,
        *("--multi_gpu", "--num_machines", "1", "--mixed_precision", "no"),
        *("--dynamo_backend", "no", "--num_processes", "2"),
    ],
    "2 processes, FSDP": FSDP,
    "2 processes, FSDP, no reshard after forward": [*FSDP, "--fsdp_reshard_after_forward", "false"],
}


def step_seconds(setting: str, run: Path, args: argparse.Namespace) -> list[float]:
    """Seconds of each step after the warm-up, of one training run in ``setting``."""
    train = ["-m", "raptb", "train", "--steps", str(args.steps)]
    train += ["--batch-size", str(args.batch_size), "--model", args.model]
    train += ["--lora-rank", str(args.lora_rank), "--grad-accum", "1"]
    train += ["--threads", "1", "--no-progress", "--out", str(run)]
    launch = LAUNCH[setting]
    # a port of our own: the default rendezvous port may be taken by another job on the machine
    port = ["--main_process_port", str(free_port())]
    command = [sys.executable, *train] if launch is None else [*launch, *port, *train]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{setting} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [r["seconds"] for r in records[args.warmup :]]


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _local_bytes(tensor: Any) -> int:
    """Bytes this rank stores of ``tensor`` (its shard, when sharded)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _state_bytes(out: Path, model: str, lora_rank: int) -> None:
    """One optimizer step of a 2-rank run (sharded or not, from the environment); writes this
    rank's bytes of parameters, gradients and optimizer states."""
    import torch

    from raptb.app.configuration.config import build_config
    from raptb.app.training.train import Trainer

    overrides = {"model": model, "lora.rank": lora_rank, "steps": 1, "threads": 1}
    overrides |= {"optim.batch_size": 4, "replay.kind": "none", "checkpoint_every": 10}
    trainer = Trainer(build_config(overrides=overrides), out / "run", progress=False)
    trainer._optimizer_step()
    params = list(trainer.policy.model.parameters())
    found = {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            _local_bytes(v)
            for state in trainer.optimizer.state.values()
            for v in state.values()
            if torch.is_tensor(v) and v.ndim
        ),
    }
    (out / f"rank{trainer.dist.rank}.json").write_text(json.dumps(found))


def _rank_main(rank: int, port: int, env: dict[str, str], out: Path, model: str, lora: int) -> None:
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    os.environ.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    _state_bytes(out, model, lora)


def state_bytes(fsdp: bool, out: Path, args: argparse.Namespace) -> dict[str, int]:
    """Rank 0's bytes of model state after one step on 2 ranks, sharded or not."""
    import torch.multiprocessing as mp

    port = free_port()
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"} if fsdp else {}
    out.mkdir(parents=True)
    work = (port, env, out, args.model, args.lora_rank)
    mp.start_processes(_rank_main, args=work, nprocs=2, start_method="spawn")
    return json.loads((out / "rank0.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    settings = list(LAUNCH)
    seconds: dict[str, list[float]] = {setting: [] for setting in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            shift = round_ % len(settings)
            for number, setting in enumerate(settings[shift:] + settings[:shift]):
                run = Path(tmp) / f"r{round_}-{number}"
                seconds[setting] += step_seconds(setting, run, args)
        memory = (
            {fsdp: state_bytes(fsdp, Path(tmp) / f"mem-{fsdp}", args) for fsdp in (False, True)}
            if args.memory
            else None
        )
    rate = {p: 1.0 / statistics.median(s) for p, s in seconds.items()}
    base = settings[0]
    print(f"model {args.model}, LoRA rank {args.lora_rank}, global batch {args.batch_size}, ")
    print(f"{len(seconds[base])} timed steps per setting")
    print("| setting | median s/step | steps/s | trajectories/s | throughput vs 1 process |")
    print("|---|---:|---:|---:|---:|")
    for p in settings:
        median = statistics.median(seconds[p])
        print(
            f"| {p} | {median:.3f} | {rate[p]:.2f} | {rate[p] * args.batch_size:.1f} "
            f"| {rate[p] / rate[base]:.2f}x |"
        )
    if memory is not None:
        print("\n| per rank (MiB) | parameters | gradients | optimizer states | total |")
        print("|---|---:|---:|---:|---:|")
        for fsdp, found in memory.items():
            name = "2 processes, FSDP" if fsdp else "2 processes, data-parallel"
            mib = {k: v / 2**20 for k, v in found.items()}
            total = sum(mib.values())
            print(
                f"| {name} | {mib['params']:.1f} | {mib['grads']:.1f} | {mib['optimizer']:.1f} "
                f"| {total:.1f} |"
            )


if __name__ == "__main__":
    main()
