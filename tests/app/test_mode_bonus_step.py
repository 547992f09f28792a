"""``objective.mode_bonus`` in the GFlowNet trainer (app.training.gflownet.algorithm): each
micro-batch's term is core.gfn.mode_bonus's on the right rows (the correct on-policy ones; the
replayed ones never), with n = its prompt's on-policy rows in the whole step, held to a slow
per-row reference on the rows the trainer really drew; the term is added to the loss that is
backpropagated; an RL loss refuses the knob; 0 is the objective alone."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from raptb.app.configuration.config import ConfigError
from raptb.app.training import step as step_module
from raptb.app.training.gflownet import algorithm as algorithm_module
from raptb.app.training.train import Trainer
from raptb.core.gfn.batch import PrefixBatch
from tests.app.test_train import small_config

WEIGHT, CAP = 0.5, 40.0


def _spy(monkeypatch) -> list[tuple[int, list, object]]:
    calls: list[tuple[int, list, object]] = []
    real = algorithm_module.loss_step

    def spy(policy, objective, log_z, parts, step, weight, agree, extra_term=None, **kw):
        calls.append((step, list(parts), extra_term))
        return real(policy, objective, log_z, parts, step, weight, agree, extra_term, **kw)

    monkeypatch.setattr(algorithm_module, "loss_step", spy)
    return calls


def _random_prefixes(rows: int, t: int, rng: np.random.Generator) -> PrefixBatch:
    log_pf = torch.as_tensor(-rng.exponential(1.0, size=(rows, t)), dtype=torch.float32)
    log_pterm = torch.as_tensor(-rng.exponential(1.0, size=(rows, t + 1)), dtype=torch.float32)
    length = torch.as_tensor(rng.integers(0, t + 1, size=rows))
    return PrefixBatch(log_pf, log_pterm, 0 * log_pterm, 0 * log_pterm, length)


def test_the_terms_rows_and_n_are_the_steps(tmp_path: Path, monkeypatch) -> None:
    config = small_config(
        loss="raptb",
        steps=3,
        **{
            "replay.kind": "rp",
            "optim.grad_accum": 2,
            "objective.mode_bonus": WEIGHT,
            "objective.mode_bonus_cap": CAP,
        },
    )
    trainer = Trainer(config, tmp_path, progress=False)
    # every scored row counts as correct, so that the on-policy rows are exactly the eligible ones
    trainer.spec = replace(trainer.spec, is_correct=lambda score: True)
    calls = _spy(monkeypatch)
    trainer.train()
    by_step = defaultdict(list)
    for step, parts, term in calls:
        by_step[step].append((parts, term))
    assert sorted(by_step) == [0, 1, 2]
    rng = np.random.default_rng(0)
    saw_replayed = False
    for micro_batches in by_step.values():
        drawn = Counter()
        for parts, _ in micro_batches:
            for batch, _ in parts:
                drawn[batch.prompt] += len(batch.on_policy)
        for parts, term in micro_batches:
            rows = [(batch, i) for batch, _ in parts for i in range(len(batch.rows))]
            saw_replayed |= any(batch.replayed for batch, _ in parts)
            prefixes = _random_prefixes(len(rows), 5, rng)
            lp = (prefixes.log_pf * prefixes.token_mask).sum(1).double() + prefixes.log_pterm[
                torch.arange(len(rows)), prefixes.length
            ].double()
            expected = 0.0
            for r, (batch, i) in enumerate(rows):
                if i in batch.on_policy and not batch.replayed:
                    n = drawn[batch.prompt]
                    expected += min(1 / (n * math.exp(float(lp[r]))), CAP) * float(lp[r])
            expected *= -WEIGHT / len(rows)
            assert float(term(prefixes)) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert saw_replayed  # the reference's exclusion of replayed rows was exercised


def test_the_term_is_added_to_the_backpropagated_loss(tmp_path: Path, monkeypatch) -> None:
    trainer = Trainer(small_config(loss="tb", steps=1), tmp_path, progress=False)
    calls = _spy(monkeypatch)
    trainer.train()
    _, parts, term = calls[0]
    assert term is None  # mode_bonus 0: the objective alone
    algorithm = trainer.algorithm
    args = (trainer.policy, algorithm.objective, algorithm.log_z, parts, 1, 1.0, None)
    plain = step_module.loss_step(*args)
    added = step_module.loss_step(*args, lambda prefixes: torch.tensor(1.25))
    assert added.loss == pytest.approx(plain.loss + 1.25, rel=1e-6)


def test_an_rl_loss_refuses_the_knob() -> None:
    with pytest.raises(ConfigError, match=r"objective.mode_bonus.*--loss g2rpo"):
        small_config(loss="grpo", **{"objective.mode_bonus": 0.1})


def test_a_pair_moves_the_weight_over_the_schedule(tmp_path: Path, monkeypatch) -> None:
    # (1, 0) over 4 steps: 1, 0.75, 0.5, 0.25 at steps 0-3; the term scales with it
    overrides = {"objective.mode_bonus": (1.0, 0.0), "optim.grad_accum": 1}
    trainer = Trainer(small_config(loss="tb", steps=4, **overrides), tmp_path, progress=False)
    trainer.spec = replace(trainer.spec, is_correct=lambda score: True)
    calls = _spy(monkeypatch)
    trainer.train()
    rng = np.random.default_rng(1)
    for step, parts, term in calls:
        prefixes = _random_prefixes(sum(len(b.rows) for b, _ in parts), 5, rng)
        unit = algorithm_module.mode_bonus_term(
            prefixes,
            torch.tensor([i in b.on_policy for b, _ in parts for i in range(len(b.rows))]),
            torch.full((prefixes.batch_size,), float(sum(len(b.on_policy) for b, _ in parts))),
            1.0,
            1000.0,
        )
        assert float(term(prefixes)) == pytest.approx((1 - step / 4) * float(unit), rel=1e-5)
    assert [step for step, _, _ in calls] == [0, 1, 2, 3]
