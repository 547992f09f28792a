"""``optim.log_z_start = "batch"``: logZ starts at the first step's batch estimate, computed here
by hand from the step's texts (their rewards from the exact Expr24 evaluator, their log P_F from
a teacher-forced pass of the initial weights), then stays where training puts it."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from raptb.adapters.tasks.expr24.task import evaluate_expression
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer

SCALE = 50.0


def trainer(tmp_path: Path, **overrides) -> Trainer:
    cfg = build_config(
        overrides={
            "threads": 1,
            "steps": 2,
            "optim.batch_size": 8,
            "optim.grad_accum": 2,
            "optim.log_z_start": "batch",
            "optim.log_z_lr": 0.0,
            "replay.kind": "none",
            "reward.reward_scale": SCALE,
            **overrides,
        }
    )
    return Trainer(cfg, tmp_path, progress=False)


def first_step(run: Trainer) -> tuple[list[str], torch.nn.Module, dict]:
    """Take the first optimizer step; return its texts, the weights before it, and its record."""
    initial = copy.deepcopy(run.policy.model)
    collect, texts = run.algorithm._collect, []

    def recording_collect():
        batch = collect()
        texts.extend(text for piece in batch.pieces for text in piece.texts)
        return batch

    run.algorithm._collect = recording_collect
    record = run._optimizer_step()
    run.step += 1
    run.algorithm._collect = collect
    return texts, initial, record


def hand_estimate(run: Trainer, texts: list[str], initial: torch.nn.Module) -> float:
    """Minus the mean of log P_F(x) - log R(x): log P_F from the initial weights (each token's
    log-softmax over the whole vocabulary, then the stop's, which the objectives keep even at
    max_length where the sampler forces it), log R = SCALE * [x equals 24] (kappa = 0)."""
    policy = run.policy
    sub = {text: policy.legal_ids[j] for j, text in enumerate(policy.texts)}
    prompt = policy.prompt_ids(run.task.prompt)
    total = 0.0
    for text in texts:
        ids = torch.tensor([prompt + [sub[c] for c in text]])
        with torch.no_grad():
            log_p = torch.log_softmax(initial(input_ids=ids).logits[0].double(), dim=-1)
        nexts = [sub[c] for c in text] + [policy.stop_id]
        log_pf = sum(float(log_p[len(prompt) - 1 + k, t]) for k, t in enumerate(nexts))
        log_r = SCALE if evaluate_expression(text) == Fraction(24) else 0.0
        total += log_pf - log_r
    return -total / len(texts)


def test_log_z_starts_at_the_first_steps_batch_estimate(tmp_path: Path) -> None:
    run = trainer(tmp_path)
    assert float(run.algorithm.log_z.detach()) == 0.0
    texts, initial, record = first_step(run)
    assert len(texts) == 16
    expected = hand_estimate(run, texts, initial)
    assert expected > 10  # ~ -log P_F of random texts: far from the log_z_init of 0
    assert record["log_z"] == pytest.approx(expected, rel=1e-5)
    # held (log_z_lr 0): the estimate is taken once, not at every step
    second = run._optimizer_step()
    assert second["log_z"] == record["log_z"]


def test_the_batch_start_is_then_trained_and_a_resumed_run_keeps_its_log_z(
    tmp_path: Path,
) -> None:
    run = trainer(tmp_path, **{"optim.log_z_lr": 0.1})
    texts, initial, record = first_step(run)
    estimate = hand_estimate(run, texts, initial)
    # one AdamW step of lr 0.1 from the estimate: |change| <= lr (Adam's first step is lr * sign)
    assert record["log_z"] == pytest.approx(estimate, abs=0.1 + 1e-4)
    assert record["log_z"] != pytest.approx(estimate, abs=1e-3)
    run.algorithm.load_extra_state({"log_z": torch.tensor(3.0)})
    assert run._optimizer_step()["log_z"] == pytest.approx(3.0, abs=0.1 + 1e-4)
