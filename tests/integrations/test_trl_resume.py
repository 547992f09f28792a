"""A GFlowNetTrainer run stopped after a checkpoint and resumed from it equals the uninterrupted
run, as TRL's GRPOTrainer's does: the losses of the steps after the checkpoint, logZ, the replay
buffer and the weights, for RP and SubM replay, with and without LoRA, on one process and on two
(gloo). And logZ, a parameter outside the model that transformers' ``model.zero_grad()`` does not
reach, is stepped on its own step's gradient only: three Adam steps computed by hand.

(``raptb train``'s own resume is held by tests/app/test_crash_safety.py on one process and by
tests/app/test_distributed.py and tests/app/test_two_nodes.py on two.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
import torch
from datasets import Dataset
from transformers import TrainerCallback

from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from tests.integrations.trl_fixtures import CPU_RUN, scorable_lowercase

STEPS, SAVE = 4, 2
LOG_Z_INIT = 30.0


class StopAt(TrainerCallback):
    """Ends training after optimizer step ``step`` (its checkpoint written), as a preempted job."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def run(
    model_dir: Path,
    out: Path,
    replay: str,
    lora: bool,
    stop_at: int | None = None,
    resume: Path | None = None,
) -> dict[str, Any]:
    """Train STEPS steps (checkpoints every SAVE) into ``out``; what the comparison reads."""
    args = GFlowNetConfig(
        **{
            **CPU_RUN,
            "save_strategy": "steps",
            "save_steps": SAVE,
            "save_only_model": False,
        },
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        num_generations=4,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        loss="raptb",
        replay=replay,
        reward_scale=10.0,
        log_z_init=LOG_Z_INIT,
        log_z_lr=0.5,
        kappa=0.5,
        seed=7,
    )
    kwargs: dict[str, Any] = {}
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    trainer = GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=scorable_lowercase,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"p{i}" for i in range(32)]}),
        callbacks=[StopAt(stop_at)] if stop_at is not None else None,
        **kwargs,
    )
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    buffer = trainer.buffer
    return {
        "losses": {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h},
        "log_z": trainer.log_z.item(),
        "buffer": sorted(
            (it.prompt, it.tokens, tuple(it.u.tolist()), it.terminal_log_r)
            for p in buffer.prompts()
            for it in buffer.items(p)
        ),
        "weights": {
            k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad
        },
        "step": trainer.state.global_step,
    }


def resume_case(model_dir: Path, root: Path, replay: str, lora: bool) -> tuple[dict, dict]:
    """(uninterrupted, stopped after step SAVE then resumed from its checkpoint)."""
    straight = run(model_dir, root / "straight", replay, lora)
    stopped = run(model_dir, root / "stopped", replay, lora, stop_at=SAVE)
    assert stopped["step"] == SAVE
    resumed = run(
        model_dir,
        root / "stopped",
        replay,
        lora,
        resume=root / "stopped" / f"checkpoint-{SAVE}",
    )
    return straight, resumed


def assert_same_run(straight: dict, resumed: dict) -> None:
    assert resumed["step"] == straight["step"] == STEPS
    later = [s for s in straight["losses"] if s > SAVE]
    assert later == [s for s in resumed["losses"] if s > SAVE] == list(range(SAVE + 1, STEPS + 1))
    np.testing.assert_allclose(
        [resumed["losses"][s] for s in later],
        [straight["losses"][s] for s in later],
        rtol=1e-6,
        atol=1e-7,
    )
    assert resumed["log_z"] == pytest.approx(straight["log_z"], rel=1e-6, abs=1e-6)
    assert straight["log_z"] != LOG_Z_INIT
    assert len(straight["buffer"]) > 0
    assert [row[:2] for row in resumed["buffer"]] == [row[:2] for row in straight["buffer"]]
    np.testing.assert_allclose(
        [row[3] for row in resumed["buffer"]], [row[3] for row in straight["buffer"]], rtol=1e-6
    )
    assert resumed["weights"].keys() == straight["weights"].keys()
    for name, weight in straight["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("replay", ["rp", "subm"])
def test_a_resumed_run_equals_the_uninterrupted_one(
    model_dir: Path, tmp_path: Path, replay: str, lora: bool
) -> None:
    assert_same_run(*resume_case(model_dir, tmp_path, replay, lora))


CASES = [(replay, lora) for replay in ("rp", "subm") for lora in (False, True)]


def _every_case_on_this_rank(model_dir: Path, root: Path) -> None:
    """Body of one gloo rank: every case's two runs, saved as root/rank<r>.pt."""
    found = {}
    for replay, lora in CASES:
        straight, resumed = resume_case(model_dir, root / f"{replay}-{lora}", replay, lora)
        found[(replay, lora)] = (straight, resumed, torch.distributed.get_world_size())
    rank = torch.distributed.get_rank()
    torch.save(found, root / f"rank{rank}.pt")


def test_on_two_processes_a_resumed_run_equals_the_uninterrupted_one(
    model_dir: Path, tmp_path: Path
) -> None:
    from tests.app.distributed_worker import run_ranks

    run_ranks(_every_case_on_this_rank, model_dir, tmp_path)
    for rank in (0, 1):
        found = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert sorted(found) == sorted(CASES)
        for straight, resumed, world in found.values():
            assert world == 2
            assert_same_run(straight, resumed)


class Record(TrainerCallback):
    """At each step's start, which optimizer parameters hold a gradient; at its end, logZ."""

    def __init__(self, log_z: torch.Tensor) -> None:
        self.log_z = log_z
        self.with_grad: list[int] = []
        self.after: list[float] = []

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.with_grad.append(sum(p.grad is not None for p in params))
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.after.append(self.log_z.item())
        return control


def test_log_z_takes_adam_steps_on_its_own_steps_gradient(model_dir: Path, tmp_path: Path) -> None:
    args = GFlowNetConfig(
        **CPU_RUN,
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=8,
        num_generations=4,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        loss="tb",
        replay="none",
        reward_scale=10.0,
        log_z_init=LOG_Z_INIT,
        log_z_lr=0.5,
    )
    trainer = GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=scorable_lowercase,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"p{i}" for i in range(16)]}),
    )
    grads: list[float] = []  # d loss / d logZ of each backward (one per step here)
    trainer.log_z.register_hook(lambda g: grads.append(float(g)))
    record = Record(trainer.log_z)
    trainer.add_callback(record)
    trainer.train()
    assert len(grads) == 3
    # Adam (torch's AdamW, weight decay 0 in logZ's group) by hand, on each step's own gradient
    b1, b2, eps, lr = args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.log_z_lr
    value, m, v, want = LOG_Z_INIT, 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        value -= lr * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
        want.append(value)
    np.testing.assert_allclose(record.after, want, rtol=1e-6, atol=1e-5)
    assert record.with_grad == [0, 0, 0]  # no parameter in the optimizer carries a gradient over
