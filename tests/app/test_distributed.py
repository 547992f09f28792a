"""Data-parallel training: 2 real processes on CPU (gloo), started by ``accelerate launch``.

``accelerate launch --multi_gpu --num_processes 2`` on a machine without a visible GPU starts two
torchrun workers whose ``PartialState(cpu=True)`` is MULTI_CPU over gloo (``--cpu`` would start a
single process). Bodies of the launched processes: tests/app/distributed_worker.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from raptb.app.distributed import (
    DistContext,
    RankSlice,
    per_rank_batch,
    rank_rng_state,
    restore_rank_rng,
    sampling_seed,
)
from raptb.core.replay import ReplayItem, make_buffer
from tests.app.distributed_worker import equivalence

WORKER = Path(__file__).with_name("distributed_worker.py")
LAUNCH = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
]


def launch(*args: str, cwd: Path) -> None:
    """Run ``args`` under 2 CPU processes; fail with their output when they fail."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*LAUNCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# --- in one process ----------------------------------------------------------------------------


def test_batch_split_refuses_uneven_batches():
    assert per_rank_batch(32, 4) == 8
    with pytest.raises(ValueError, match="does not split evenly over 3 processes"):
        per_rank_batch(32, 3)


def test_sampling_seeds_keep_rank_0_and_differ_by_rank():
    seeds = [sampling_seed(5, rank) for rank in range(4)]
    assert seeds[0] == 5
    assert len(set(seeds)) == 4
    assert sampling_seed(6, 0) not in seeds  # run seed 6 does not reuse run 5's rank streams


def _items(count: int) -> list[ReplayItem]:
    return [
        ReplayItem(prompt="p", tokens=(i,), text=str(i), log_r=[0.0, i], u=[0.0, i], valid=True)
        for i in range(count)
    ]


def test_rank_slices_split_one_draw():
    buffer = make_buffer("rp", capacity=50)
    buffer.add(_items(50))
    whole = [it.text for it in buffer.sample(12, np.random.default_rng(3), "p")]
    parts = []
    for rank in range(3):
        ctx = DistContext(rank=rank, world_size=3, local_rank=rank, device=torch.device("cpu"))
        parts += [it.text for it in RankSlice(buffer, ctx).sample(4, np.random.default_rng(3))]
    assert parts == whole


def test_resume_on_another_world_size_warns_and_reseeds(caplog):
    saved = [rank_rng_state(torch.Generator().manual_seed(s)) for s in (1, 2)]
    ctx = DistContext.single()
    same = torch.Generator()
    restore_rank_rng(ctx, saved[:1], same, seed=0, step=4)
    assert torch.equal(same.get_state(), saved[0]["generator"])
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        restore_rank_rng(ctx, saved, torch.Generator(), seed=0, step=4)
    assert "written by 2 processes, resuming on 1" in caplog.text
    third = DistContext(rank=2, world_size=3, local_rank=2, device=torch.device("cpu"))
    fresh = torch.Generator()
    restore_rank_rng(third, saved, fresh, seed=0, step=4)
    assert not torch.equal(fresh.get_state(), torch.Generator().get_state())


# --- 2 processes -------------------------------------------------------------------------------


def test_two_ranks_half_batches_equal_one_rank_whole_batch(tmp_path):
    """Gradients (logZ's included) are averaged over ranks, neither summed nor left local: one
    step on 2 ranks x B/2 equals 1 rank x B, and both ranks hold the same parameters."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    equivalence(one)
    launch(str(WORKER), "equivalence", str(two), cwd=tmp_path)
    reference = torch.load(one / "rank0.pt")
    ranks = [torch.load(two / f"rank{r}.pt") for r in (0, 1)]
    assert reference["grads"].keys() == ranks[0]["grads"].keys()
    assert "log_z" in reference["grads"]
    for rank in ranks:
        for part in ("grads", "params"):
            for name, value in reference[part].items():
                torch.testing.assert_close(rank[part][name], value, rtol=1e-5, atol=1e-6)
    for name, value in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], value), name
    metrics = [
        json.loads(line) for line in (two / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    reference_metrics = json.loads((one / "run" / "metrics.jsonl").read_text())
    assert len(metrics) == 1
    assert metrics[0]["loss"] == pytest.approx(reference_metrics["loss"], rel=1e-5)


def test_ranks_hold_identical_buffers_and_draw_disjoint_slices(tmp_path):
    launch(str(WORKER), "buffers", str(tmp_path), cwd=tmp_path)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for kind in ("subm", "rp"):
        assert rank0[kind]["stored"] == rank1[kind]["stored"], kind
        assert len(rank0[kind]["stored"]) == 12  # filled from both ranks' items
        assert rank0[kind]["drawn"] + rank1[kind]["drawn"] == rank0[kind]["global_draw"]
        assert rank0[kind]["rng_after"] == rank1[kind]["rng_after"]


def _trainer_state(checkpoint: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    saved = torch.load(checkpoint / "trainer.pt", weights_only=True)
    return load_file(checkpoint / "model" / "model.safetensors"), saved["log_z"]


def test_raptb_train_under_two_processes_checkpoints_and_resumes_exactly(tmp_path):
    """``accelerate launch -m raptb train`` completes with one run directory (rank 0 writes);
    resuming its step-2 checkpoint reproduces step 3 of the uninterrupted run."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    flags = ["--steps", "3", "--batch-size", "4", "--grad-accum", "2", "--checkpoint-every", "2"]
    flags += ["--replay", "subm", "--threads", "1", "--no-progress"]
    launch("-m", "raptb", "train", *flags, "--out", str(straight), cwd=tmp_path)
    checkpoints = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert checkpoints == ["step-000002", "step-000003"]
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    state = torch.load(straight / "checkpoints" / "step-000003" / "trainer.pt")
    assert len(state["ranks_rng"]) == 2

    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000003")
    (resumed / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    launch("-m", "raptb", "train", "--resume", "--out", str(resumed), "--no-progress", cwd=tmp_path)
    drop = ("seconds",)
    last = [
        {k: v for k, v in json.loads(path.read_text().splitlines()[-1]).items() if k not in drop}
        for path in (straight / "metrics.jsonl", resumed / "metrics.jsonl")
    ]
    assert last[0] == last[1]
    (weights_a, log_z_a), (weights_b, log_z_b) = (
        _trainer_state(run / "checkpoints" / "step-000003") for run in (straight, resumed)
    )
    assert torch.equal(log_z_a, log_z_b)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
