"""Fully sharded training (FSDP2) on 2 real CPU processes (gloo): the policy is split across
ranks, yet training is the same computation as on one process.

Ranks are forked from the test process with the environment ``accelerate launch`` gives an FSDP
config's workers (tests/app/distributed_worker.py: run_ranks with FSDP_ENV); one test starts
``accelerate launch --config_file configs/accelerate/fsdp_cpu_2proc.yaml -m raptb train``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from raptb.adapters.lm.models import build_char_tokenizer, build_tiny_model
from raptb.app.configuration.config import build_config
from raptb.app.distribution.distributed import DistContext
from raptb.app.distribution.sharding import ShardingPlan, plan_from_accelerate, shard_model
from raptb.app.task_and_policy import build_policy, build_task
from tests.app.distributed_worker import (
    FSDP_ENV,
    cli,
    clipping,
    equivalence,
    free_port,
    nonfinite_on_one_rank,
    run_ranks,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"


def _last_record(run: Path) -> dict:
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    record.pop("seconds")
    return record


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [({"FSDP_VERSION": "1"}, "error: FSDP version 1 is not supported")],
)
def test_unsupported_fsdp_settings_are_refused_in_one_line(
    monkeypatch, capsys, tmp_path, env, message
):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cli("train", "--steps", "1", "--out", str(tmp_path / "run"), "--no-progress", expect=2)
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err


def test_the_plan_is_read_from_the_accelerate_fsdp_settings(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert plan_from_accelerate() == ShardingPlan(
        wrap=None, reshard_after_forward=True, offload=False
    )
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")  # as the configs set
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "GPT2Block, LlamaDecoderLayer")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    assert plan_from_accelerate() == ShardingPlan(
        wrap=("GPT2Block", "LlamaDecoderLayer"),
        reshard_after_forward=False,
        offload=True,
        activation_checkpointing=True,
    )


def test_sharding_refuses_cpu_offload_on_the_cpu_and_a_model_without_the_named_blocks():
    model = build_tiny_model(build_char_tokenizer(), seed=0)
    with pytest.raises(ValueError, match="fsdp_offload_params needs a GPU"):
        shard_model(model, ShardingPlan(wrap=None, reshard_after_forward=True, offload=True))
    with pytest.raises(ValueError, match="no module of class LlamaDecoderLayer"):
        plan = ShardingPlan(wrap=("LlamaDecoderLayer",), reshard_after_forward=True, offload=False)
        shard_model(model, plan)


def test_rollout_stepping_on_for_other_ranks_changes_nothing():
    """A rank whose rows have all stopped steps on (forwards only) while others still sample: its
    rollout, and its generator's state afterwards, are those of a rollout that stopped at once."""
    config = build_config(overrides={"threads": 1})
    task = build_task(config)
    policy = build_policy(config.model, task, 0, device=torch.device("cpu"))
    policy.decode = "eager"  # a sharded rank's path (compiled is for one process), alone as well
    prompt = task.prompts()[0]
    # a horizon past the grammar's longest expression, so every row stops before it
    lengths = {"min_length": task.min_length, "max_length": task.max_length + 3}
    alone_gen = torch.Generator().manual_seed(3)
    alone = policy.sample(prompt, 6, generator=alone_gen, **lengths)
    assert int(alone.length.max()) < lengths["max_length"]
    calls: list[bool] = []

    def others_still_going(done: bool) -> bool:
        calls.append(done)
        return False  # some other rank never finishes before max_length

    policy.step_together = others_still_going
    locked_gen = torch.Generator().manual_seed(3)
    locked = policy.sample(prompt, 6, generator=locked_gen, **lengths)
    assert calls.count(True) > 0  # it did step on after its own rows had stopped
    assert len(calls) == lengths["max_length"]
    for name in ("tokens", "length", "log_pf", "log_pterm"):
        assert torch.equal(getattr(locked, name), getattr(alone, name)), name
    assert locked.texts == alone.texts
    assert torch.equal(locked_gen.get_state(), alone_gen.get_state())


# --- 2 processes -------------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [0, 4])
def test_sharded_two_ranks_half_batches_equal_one_rank_whole_batch(tmp_path, lora):
    """With the policy sharded (full fine-tuning, or LoRA with its adapters sharded in their
    blocks), one step on 2 ranks x B/2 gives the gradients, parameters and logZ of 1 unsharded
    rank x B: FSDP's reduce-scatter averages the model's gradients, logZ's is all-reduced."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    equivalence(one, DistContext.single(torch.device("cpu")), lora)
    run_ranks(equivalence, two, None, lora, env=FSDP_ENV)
    _assert_equivalent(one, two, lora)


@pytest.mark.parametrize("lora", [0, 4])
def test_sharded_with_activation_checkpointing_equals_one_rank_without(tmp_path, lora):
    """accelerate's fsdp_activation_checkpointing on 2 sharded ranks: the blocks recomputed in
    backward under FSDP2 give the gradients and parameters of one unsharded, uncheckpointed rank."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    equivalence(one, DistContext.single(torch.device("cpu")), lora)
    checkpointing = {**FSDP_ENV, "FSDP_ACTIVATION_CHECKPOINTING": "true"}
    run_ranks(equivalence, two, None, lora, True, env=checkpointing)
    _assert_equivalent(one, two, lora)


def _assert_equivalent(one: Path, two: Path, lora: int) -> None:
    """The 2-rank run in ``two`` has the 1-rank run's gradients, parameters and logZ."""
    reference = torch.load(one / "rank0.pt")
    ranks = [torch.load(two / f"rank{r}.pt") for r in (0, 1)]
    assert reference["grads"].keys() == ranks[0]["grads"].keys()
    assert "log_z" in reference["grads"] and reference["grads"]["log_z"].abs() > 0
    if lora:
        assert all("lora_" in name for name in reference["grads"] if name != "log_z")
        assert any(
            g.abs().max() > 1e-4 for name, g in reference["grads"].items() if "lora_B" in name
        )
    for rank in ranks:
        for name, grad in reference["grads"].items():
            # one rank rescores by the embedded model's compiled path, the sharded ranks by
            # transformers' forward: float rounding of two computations (1.8e-5 measured); a wrong
            # average over ranks is off by the gradient itself
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-3, atol=5e-5)
            sure = grad.abs() > 1e-4  # see test_distributed: AdamW's first step amplifies noise
            # (LoRA's A matrices have a zero gradient at the first step, B being 0)
            assert sure.any() or (lora and not grad.any()), name
            torch.testing.assert_close(rank["params"][name][sure], reference["params"][name][sure])
        for name, value in reference["params"].items():
            if name not in reference["grads"]:  # frozen weights come back whole and unchanged
                assert torch.equal(rank["params"][name], value), name
    for name, value in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], value), name


def test_clipping_takes_one_norm_over_shards_and_plain_parameters(tmp_path):
    run_ranks(clipping, tmp_path, env=FSDP_ENV)
    for rank in (0, 1):
        found = torch.load(tmp_path / f"rank{rank}.pt")
        raw = found["raw"]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in raw.values()))  # the slow way
        assert found["norm"] == pytest.approx(float(norm), rel=1e-5)
        factor = 1.5 / (float(norm) + 1e-6)
        assert factor < 1
        for name, grad in raw.items():
            torch.testing.assert_close(found["clipped"][name], grad * factor, rtol=1e-5, atol=1e-7)


def test_sharded_train_checkpoints_resume_exactly_and_anywhere(tmp_path, capfd):
    """``raptb train`` sharded on 2 ranks (SubM replay, clipping on): checkpoints hold the whole
    weights and optimizer states in the unsharded format; resuming step 2 sharded reproduces step
    3 exactly; the same checkpoint resumes on one unsharded process after one warning, and
    ``raptb eval`` reads it."""
    straight = tmp_path / "straight"
    flags = ["--steps", "3", "--batch-size", "4", "--grad-accum", "2", "--checkpoint-every", "2"]
    flags += ["--replay", "subm", "--threads", "1", "--no-progress"]
    run_ranks(cli, "train", *flags, "--out", str(straight), env=FSDP_ENV)
    plain = tmp_path / "plain"
    cli("train", "--steps", "1", "--threads", "1", "--no-progress", "--out", str(plain))
    ours = load_file(straight / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    theirs = load_file(plain / "checkpoints" / "step-000001" / "model" / "model.safetensors")
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    optimizer = torch.load(straight / "checkpoints" / "step-000002" / "trainer.pt")["optimizer"]
    reference = torch.load(plain / "checkpoints" / "step-000001" / "trainer.pt")["optimizer"]
    assert len(optimizer["state"]) == len(reference["state"])
    for index, entry in reference["state"].items():
        assert optimizer["state"][index]["exp_avg"].shape == entry["exp_avg"].shape

    resumed, unsharded = tmp_path / "resumed", tmp_path / "unsharded"
    for run in (resumed, unsharded):
        shutil.copytree(straight, run)
        shutil.rmtree(run / "checkpoints" / "step-000003")
    run_ranks(cli, "train", "--resume", "--out", str(resumed), "--no-progress", env=FSDP_ENV)
    assert _last_record(resumed) == _last_record(straight)
    weights_a, weights_b = (
        load_file(run / "checkpoints" / "step-000003" / "model" / "model.safetensors")
        for run in (straight, resumed)
    )
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)

    capfd.readouterr()
    cli("train", "--resume", "--out", str(unsharded), "--no-progress")
    assert capfd.readouterr().err.count("checkpoint written by 2 processes, resuming on 1") == 1
    assert [json.loads(line)["step"] for line in (unsharded / "metrics.jsonl").open()] == [1, 2, 3]

    run_ranks(
        cli, "eval", str(straight), "--samples", "8", "--batch-size", "4", "--json", env=FSDP_ENV
    )
    assert len((straight / "eval" / "samples.jsonl").read_text().splitlines()) == 8


def test_accelerate_launch_with_the_fsdp_config_trains_lora(tmp_path):
    """The command a user types, with the shipped FSDP config: 2 CPU processes, LoRA."""
    run = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(CONFIGS / "fsdp_cpu_2proc.yaml"), "--main_process_port", str(free_port())]
    args = ["-m", "raptb", "train", "--steps", "2", "--batch-size", "4", "--lora-rank", "4"]
    args += ["--threads", "1", "--no-progress", "--out", str(run)]
    done = subprocess.run(
        [*launch, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.count("done: 2/2 steps") == 1
    assert done.stderr.count("FSDP: the policy is sharded over 2 processes (2 blocks") == 1
    adapter = load_file(run / "checkpoints" / "step-000002" / "model" / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter)
    state = torch.load(run / "checkpoints" / "step-000002" / "trainer.pt")
    assert len(state["ranks_rng"]) == 2


@pytest.mark.parametrize("loss", ["raptb", "grpo", "ppo"])
def test_a_nonfinite_loss_on_one_rank_skips_the_step_on_all(tmp_path, loss):
    """Rank 1's first loss is NaN: both sharded ranks skip that step and train on (GFlowNet, GRPO
    and PPO losses alike), instead of one rank waiting in a collective for the other."""
    run_ranks(nonfinite_on_one_rank, tmp_path, loss, env=FSDP_ENV)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[-1]["nonfinite_skipped"] == 1
