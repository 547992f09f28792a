"""The micro-batch split is a memory knob only (app.training.train, app.training.step_batch): with
the same seed and rows per step, ``batch_size 8 x grad_accum 4`` and ``batch_size 32 x grad_accum
1`` roll out the same rows, log the same loss and diagnostics, and take the same update (policy
weights and logZ), for every objective and replay kind. Two steps: the second draws replay rows
(the buffer holds the first step's rows) and, with Oracle replay, oracle rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from raptb.app.configuration.config import build_config
from raptb.app.training.gflownet import replay_setup
from raptb.app.training.step_batch import ORACLE, REPLAYED, SAMPLED
from raptb.app.training.train import Trainer

OBJECTIVES = ("tb", "subtb", "raptb", "avg_prefix_tb", "root_subtb_logz", "vargrad")
REPLAY = ("none", "rp", "prt", "subm", "oracle")
STEPS = 2
SOLUTIONS = ["4*6", "6*4", "3*8", "8*3", "9+9+6", "8+8+8", "2*3*4", "9+8+7", "5*5-1", "8*4-8"]


@pytest.fixture(autouse=True)
def few_oracle_solutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle holds a few Expr24 solutions instead of all (scoring all takes seconds)."""
    spec = replay_setup.task_spec("expr24")
    short = dataclasses.replace(spec, solutions=lambda task: SOLUTIONS)
    monkeypatch.setattr(replay_setup, "task_spec", lambda name: short)


def run(tmp_path: Path, batch_size: int, grad_accum: int, loss: str, kind: str):
    # SubM keeps incorrect rows too, so it has some to replay (the other kinds take no gating)
    gating = {"replay.gating_ratio": 0.0} if kind == "subm" else {}
    cfg = build_config(
        overrides={
            "optim.batch_size": batch_size,
            "optim.grad_accum": grad_accum,
            "threads": 1,
            "steps": STEPS,
            "loss": loss,
            "replay.kind": kind,
            "replay.p_replay": (0.5, 0.5),
            "replay.p_oracle": (0.5, 0.5),
            **gating,
        }
    )
    trainer = Trainer(cfg, tmp_path / f"{batch_size}x{grad_accum}", progress=False)
    start = [p.detach().clone() for p in trainer.policy.model.parameters()]
    records, texts, kinds, grads = [], [], [], []
    apply_gradients = trainer.apply_gradients

    def recording_apply() -> None:  # each step's accumulated gradients, before the update
        grads.append([p.grad.detach().clone() for p in trainer.policy.model.parameters()])
        apply_gradients()

    trainer.apply_gradients = recording_apply
    for _ in range(STEPS):
        collect = trainer.algorithm._collect
        seen = []

        def recording_collect(collect=collect, seen=seen):
            batch = collect()
            seen.extend(text for piece in batch.pieces for text in piece.texts)
            kinds.append(batch.plan.kind.tolist())
            return batch

        trainer.algorithm._collect = recording_collect
        record = trainer._optimizer_step()
        assert record is not None
        trainer.step += 1
        records.append(record)
        texts.append(seen)
    weights = [p.detach().clone() for p in trainer.policy.model.parameters()]
    moved = max(float((w - s).abs().max()) for w, s in zip(weights, start, strict=True))
    log_z = float(trainer.algorithm.log_z.detach())
    return records, texts, weights, log_z, kinds, moved, grads


def above_rounding(grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Per parameter, the entries whose gradient at every step is 0 (an unused token's row) or
    above 1e-5 of that step's largest: AdamW's first update is lr g / |g| whatever |g|, so an
    entry whose gradient is float rounding of sums (~1e-6 of the scale) moves by an amount that
    rounding decides."""
    return [
        torch.stack([(g == 0) | (g.abs() > 1e-5 * g.abs().max()) for g in steps]).all(0)
        for steps in zip(*grads, strict=True)
    ]


@pytest.mark.parametrize("kind", REPLAY)
@pytest.mark.parametrize("loss", OBJECTIVES)
def test_split_is_a_memory_knob(tmp_path: Path, loss: str, kind: str) -> None:
    split = run(tmp_path, 8, 4, loss, kind)
    whole = run(tmp_path, 32, 1, loss, kind)
    assert split[1] == whole[1]  # the same rows, in the same order
    assert split[4] == whole[4]  # of the same kinds
    used = {k for step in split[4] for k in step}
    assert used == {SAMPLED} | {"none": set(), "oracle": {ORACLE, REPLAYED}}.get(kind, {REPLAYED})
    for a, b in zip(split[0], whole[0], strict=True):
        for key in ("loss", "tb_residual_mean", "aux_loss", "acc", "replay_frac", "temperature"):
            # abs: VarGrad's mean residual is 0 up to float32 cancellation of terms ~10
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-4), key
    sure = above_rounding(whole[6])
    assert sum(int((~m).sum()) for m in sure) <= 1e-2 * sum(m.numel() for m in sure)
    for a, b, m in zip(split[2], whole[2], sure, strict=True):
        torch.testing.assert_close(a[m], b[m], rtol=1e-3, atol=1e-5)  # Adam: g / sqrt(v)
    assert split[3] == pytest.approx(whole[3], rel=1e-6, abs=1e-7)
    assert split[5] > 1e-4  # the updates moved the weights: their equality is not vacuous
