"""Data-parallel training: 2 real processes on CPU (gloo).

Most cases fork the ranks from the test process with a launcher's environment
(tests/app/distributed_worker.py: run_ranks); one starts ``accelerate launch -m raptb train``
itself, the command a user runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from raptb.app.distribution.distributed import (
    DistContext,
    per_rank_batch,
    rank_rng_state,
    restore_rank_rng,
    sampling_seed,
)
from raptb.core.replay import ReplayItem
from tests.app.distributed_worker import (
    buffers,
    cli,
    equivalence,
    free_port,
    rl_logging,
    run_ranks,
)

# accelerate launch on a machine without a visible GPU: --multi_gpu starts torchrun workers whose
# PartialState(cpu=True) is MULTI_CPU over gloo (--cpu alone would start a single process)
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
RUN_FILES = {"config.toml", "metrics.jsonl", "checkpoints"}
LOCK_FILES = {".lock", ".lock.pid"}


def _holds_one_run(run: Path) -> bool:
    """``run`` holds what one writer leaves: the run's files and its lock, nothing per rank."""
    names = {p.name for p in run.iterdir()}
    return RUN_FILES <= names <= RUN_FILES | LOCK_FILES


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


def test_resume_on_another_world_size_warns_and_reseeds():
    saved = [rank_rng_state(torch.Generator().manual_seed(s)) for s in (1, 2)]
    ctx = DistContext.single()
    same = torch.Generator()
    warnings: list[str] = []
    restore_rank_rng(ctx, saved[:1], same, seed=0, step=4, warn=warnings.append)
    assert torch.equal(same.get_state(), saved[0]["generator"])
    assert not warnings
    restore_rank_rng(ctx, saved, torch.Generator(), seed=0, step=4, warn=warnings.append)
    assert len(warnings) == 1 and "written by 2 processes, resuming on 1" in warnings[0]
    third = DistContext(rank=2, world_size=3, local_rank=2, device=torch.device("cpu"))
    fresh = torch.Generator()
    restore_rank_rng(third, saved, fresh, seed=0, step=4, warn=warnings.append)
    assert len(warnings) == 1  # rank 2 does not repeat rank 0's warning
    assert not torch.equal(fresh.get_state(), torch.Generator().get_state())
    assert not torch.equal(fresh.get_state(), same.get_state())
    widened = DistContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    restore_rank_rng(widened, saved[:1], torch.Generator(), seed=0, step=4, warn=warnings.append)
    assert "checkpoint written by 1 process, resuming on 2:" in warnings[-1]  # not "processes"


def test_deepspeed_launch_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    cli("train", "--steps", "1", "--out", str(tmp_path / "run"), "--no-progress", expect=2)
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: DeepSpeed is not supported") and "\n" not in err


# --- 2 processes -------------------------------------------------------------------------------


def test_two_ranks_half_batches_equal_one_rank_whole_batch(tmp_path):
    """Gradients (logZ's included) are averaged over ranks, neither summed nor left local: one
    step on 2 ranks x B/2 equals 1 rank x B, and both ranks hold the same parameters."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    equivalence(one, DistContext.single(torch.device("cpu")))
    run_ranks(equivalence, two)
    reference = torch.load(one / "rank0.pt")
    ranks = [torch.load(two / f"rank{r}.pt") for r in (0, 1)]
    assert reference["grads"].keys() == ranks[0]["grads"].keys()
    assert "log_z" in reference["grads"]
    assert reference["grads"]["log_z"].abs() > 0
    for rank in ranks:
        for name, grad in reference["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-4, atol=1e-5)
            # AdamW's first step is lr * g / (|g| + eps): where g is float noise (e.g. attention
            # key biases, whose true gradient is 0) it amplifies summation-order differences
            # to +-lr, so parameters are compared where the gradient is well above that noise
            sure = grad.abs() > 1e-4
            assert sure.any(), name
            torch.testing.assert_close(rank["params"][name][sure], reference["params"][name][sure])
    for name, value in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], value), name
    metrics = [
        json.loads(line) for line in (two / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    reference_metrics = json.loads((one / "run" / "metrics.jsonl").read_text())
    assert len(metrics) == 1
    assert metrics[0]["loss"] == pytest.approx(reference_metrics["loss"], rel=1e-5)
    assert metrics[0]["log_z"] == pytest.approx(reference_metrics["log_z"], rel=1e-6)


def test_ranks_hold_identical_buffers_and_draw_disjoint_slices(tmp_path):
    run_ranks(buffers, tmp_path)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for kind in ("subm", "rp"):
        assert rank0[kind]["stored"] == rank1[kind]["stored"], kind
        assert len(rank0[kind]["stored"]) == 12  # filled from both ranks' items
        assert rank0[kind]["drawn"] + rank1[kind]["drawn"] == rank0[kind]["global_draw"]
        assert rank0[kind]["rng_after"] == rank1[kind]["rng_after"]


def _trainer_state(checkpoint: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    saved = torch.load(checkpoint / "trainer.pt", weights_only=True)
    return load_file(checkpoint / "model" / "model.safetensors"), saved["log_z"]


def _last_record(run: Path) -> dict:
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    record.pop("seconds")
    return record


def test_train_on_two_ranks_checkpoints_resumes_and_evaluates(tmp_path, capfd):
    """``raptb train`` on 2 ranks: rank 0 alone writes the run directory, its checkpoints hold both
    ranks' RNG streams; resuming step 2 on 2 ranks reproduces step 3 exactly, on 1 rank it goes on
    after one warning; ``raptb eval`` on 2 ranks samples N rows on both and gathers them."""
    straight = tmp_path / "straight"
    flags = ["--steps", "3", "--batch-size", "4", "--grad-accum", "2", "--checkpoint-every", "2"]
    flags += ["--replay", "subm", "--threads", "1", "--no-progress"]
    run_ranks(cli, "train", *flags, "--out", str(straight))
    assert _holds_one_run(straight)
    checkpoints = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert checkpoints == ["step-000002", "step-000003"]
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    state = torch.load(straight / "checkpoints" / "step-000003" / "trainer.pt")
    generators = [rank["generator"] for rank in state["ranks_rng"]]
    assert len(generators) == 2 and not torch.equal(*generators)

    resumed, narrowed = tmp_path / "resumed", tmp_path / "narrowed"
    for run in (resumed, narrowed):
        shutil.copytree(straight, run)
        shutil.rmtree(run / "checkpoints" / "step-000003")
    run_ranks(cli, "train", "--resume", "--out", str(resumed), "--no-progress")
    assert _last_record(resumed) == _last_record(straight)
    assert len((resumed / "metrics.jsonl").read_text().splitlines()) == 3
    (weights_a, log_z_a), (weights_b, log_z_b) = (
        _trainer_state(run / "checkpoints" / "step-000003") for run in (straight, resumed)
    )
    assert torch.equal(log_z_a, log_z_b)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)

    capfd.readouterr()
    cli("train", "--resume", "--out", str(narrowed), "--no-progress")
    err = capfd.readouterr().err
    assert err.count("checkpoint written by 2 processes, resuming on 1") == 1
    assert [json.loads(line)["step"] for line in (narrowed / "metrics.jsonl").open()] == [1, 2, 3]

    run_ranks(cli, "eval", str(straight), "--samples", "12", "--batch-size", "4", "--json")
    rows = [json.loads(line) for line in (straight / "eval" / "samples.jsonl").open()]
    assert len(rows) == 12
    assert [row["rank"] for row in rows] == [0] * 4 + [1] * 4 + [0] * 4  # chunks round-robin
    metrics = json.loads((straight / "eval" / "metrics.json").read_text())
    assert metrics["n_samples"] == 12 and metrics["eval"]["processes"] == 2
    cli("eval", str(resumed), "--samples", "4", "--batch-size", "4", "--json")
    alone = [json.loads(line) for line in (resumed / "eval" / "samples.jsonl").open()]
    # rank 0's first chunk is the 1-process draw (the same weights, shown equal above; same seed)
    assert [row["text"] for row in alone] == [row["text"] for row in rows[:4]]


def test_accelerate_launch_runs_raptb_as_a_module(tmp_path):
    """``accelerate launch -m raptb train``: the command a user types, 2 CPU processes."""
    run = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    args = ["-m", "raptb", "train", "--steps", "1", "--batch-size", "2", "--grad-accum", "1"]
    args += ["--replay", "none", "--threads", "1", "--no-progress", "--out", str(run)]
    done = subprocess.run(
        [*LAUNCH, "--main_process_port", str(free_port()), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.count("done: 1/1 steps") == 1  # rank 0 reports
    assert _holds_one_run(run)
    state = torch.load(run / "checkpoints" / "step-000001" / "trainer.pt")
    assert len(state["ranks_rng"]) == 2


@pytest.mark.parametrize("loss", ["grpo", "ppo", "ips_grpo", "flowrl"])
def test_rl_records_and_correct_texts_count_every_rank(tmp_path, loss):
    """GRPO, PPO, IPS-GRPO (outcomes gathered over ranks) and FlowRL on 2 ranks: each step's
    logged reward mean is over both ranks' rows, and every rank holds the correct texts found by
    either (rank 0 checkpoints its set)."""
    run_ranks(rl_logging, tmp_path, loss)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["seen"] == ranks[1]["seen"]
    found = {text for rank in ranks for part in rank["own"] for text in part["correct"]}
    assert set(ranks[0]["seen"]) == found
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    for record in records:
        rows = [
            value
            for rank in ranks
            for part in rank["own"]
            if part["step"] == record["step"] - 1
            for value in part["rewards"]
        ]
        assert len(rows) == 16  # 2 micro-batches of 8 rows, 4 per rank each
        assert record["reward_mean"] == pytest.approx(float(np.mean(rows)), rel=1e-12)
