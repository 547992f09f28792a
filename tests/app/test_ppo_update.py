"""PPO on TRL's update schedule (app.training.rl.ppo_update): the one-epoch case equals the
single-pass step, later passes see the updated policy, one optimizer step per mini-batch,
mini-batches partition the rows, whole-step advantages, and the one-line error for rows that do not
split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import raptb.app.training.rl.rollout as rl_rollout
from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.training.micro_batch import step_result
from raptb.app.training.rl.ppo_update import PPORollout, mini_batches, step_targets
from raptb.app.training.rl.rl_step import rl_loss_step
from raptb.app.training.rl.rollout import RLStats, rl_record
from raptb.app.training.step import Trajectories
from raptb.app.training.train import Trainer, TrainingError
from raptb.core.rl.ppo import PPO
from tests.app.test_train import records, small_config
from tests.core import rl_reference as ref
from tests.floats import assert_records_close

ONE_PASS = {"optim.grad_accum": 1, "rl.num_ppo_epochs": 1}


class _SinglePass(Trainer):
    """PPO before the update schedule: each micro-batch scored once with gradients, the old
    log-probs and values its own detached, gradients accumulated into one optimizer step."""

    def _optimizer_step(self):
        ppo = self.algorithm
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        rollout = ppo._on_policy_rows()
        batches = rollout.micro_batches(self.rank_batch)
        results = []
        for parts in batches:
            result = rl_loss_step(
                self.policy, ppo.objective, parts, 1 / len(batches), value_head=ppo.value_head
            )
            results.append((sum(len(b.rows) for b, _ in parts), result))
        self.correct_seen.update(rollout.correct)
        self.apply_gradients()
        total = step_result(results)
        stats = RLStats(
            total.loss, total.diagnostics, rollout.on_policy, len(rollout.correct), rollout.rewards
        )
        return rl_record(self, [stats], [stats], 0.0)


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    head = {f"value_head.{k}": v for k, v in trainer.algorithm.value_head.state_dict().items()}
    return {**trainer.policy.model.state_dict(), **head}


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_one_epoch_one_mini_batch_is_the_single_pass_step(tmp_path, grad_accum):
    cfg = small_config(loss="ppo", steps=3, **{**ONE_PASS, "optim.grad_accum": grad_accum})
    scheduled = Trainer(cfg, tmp_path / "a", progress=False)
    single = _SinglePass(cfg, tmp_path / "b", progress=False)
    if grad_accum > 1:
        # the single pass whitens each micro-batch's advantages, the schedule the whole step's:
        # without whitening the two must agree, micro-batch offsets and weights included
        unwhitened = PPO(**{**cfg.objective_kwargs(), "whiten_advantages": False})
        scheduled.algorithm.objective = single.algorithm.objective = unwhitened
    scheduled.train()
    single.train()
    # two code paths that score and sum the micro-batches in other shapes and orders: equal up to
    # float reordering (a loss scaled by 1 + 1e-7 moves the weights by 1.2e-6 in 3 steps and the
    # logged values by 2e-6 relative), not bit for bit (an AVX-512 Xeon differs in the last bits)
    a, b = _state(scheduled), _state(single)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    drop = ("seconds", "ppo_updates")
    ra = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "a")]
    rb = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "b")]
    assert_records_close(ra, rb, rel_tol=1e-4, abs_tol=1e-5)
    assert all(r["ppo_updates"] == 1 for r in records(tmp_path / "a"))
    assert [r["ratio_mean"] for r in records(tmp_path / "a")] == pytest.approx([1.0] * 3, abs=1e-6)


def _hand_log_probs(trainer: Trainer, batch: Trajectories) -> list[torch.Tensor]:
    """Per row, the action log-probs (tokens then the stop) under the current weights, at the
    rollout's temperature (the one PPO scores at: tests/app/test_rl_temperature.py)."""
    with torch.no_grad():
        log_pf, log_pterm = trainer.policy.score(
            batch.prompt, batch.tokens, batch.length, batch.temperature
        )
    return [
        torch.cat([log_pf[b, :tau], log_pterm[b, tau : tau + 1]])
        for b, tau in enumerate(batch.length.tolist())
    ]


def test_second_epoch_ratio_is_that_of_the_updated_policy(tmp_path, monkeypatch):
    cfg = small_config(loss="ppo", steps=1, **{**ONE_PASS, "rl.num_ppo_epochs": 2})
    trainer = Trainer(cfg, tmp_path, progress=False)
    rolled: list[Trajectories] = []
    seen: list[tuple[torch.Tensor, torch.Tensor, dict]] = []
    weights = [{k: v.clone() for k, v in trainer.policy.model.state_dict().items()}]

    def rolling(*args, **kwargs):
        step = collect_step(*args, **kwargs)
        rolled.extend(step.pieces)
        return step

    def spying(self, batch, targets=None):
        loss, diagnostics = ppo_call(self, batch, targets)
        seen.append((batch.log_probs.detach().clone(), batch.old_log_probs.clone(), diagnostics))
        return loss, diagnostics

    def stepping():
        apply()
        weights.append({k: v.clone() for k, v in trainer.policy.model.state_dict().items()})

    collect_step, ppo_call, apply = rl_rollout.collect_step, PPO.__call__, trainer.apply_gradients
    monkeypatch.setattr(rl_rollout, "collect_step", rolling)
    monkeypatch.setattr(PPO, "__call__", spying)
    trainer.apply_gradients = stepping
    trainer.train()

    assert len(weights) == 3 and len(seen) == 2  # 2 epochs x 1 mini-batch: 2 optimizer steps
    (batch,) = rolled
    by_weights = []
    for state in weights[:2]:
        trainer.policy.model.load_state_dict(state)
        by_weights.append(_hand_log_probs(trainer, batch))
    old, new = by_weights
    for (log_probs, old_log_probs, _), current in zip(seen, by_weights, strict=True):
        for b, tau in enumerate(batch.length.tolist()):
            torch.testing.assert_close(old_log_probs[b, : tau + 1], old[b], rtol=0, atol=1e-6)
            torch.testing.assert_close(log_probs[b, : tau + 1], current[b], rtol=0, atol=1e-6)
    ratio = torch.exp(torch.cat(new) - torch.cat(old))
    assert seen[0][2]["ratio_mean"] == 1.0
    assert seen[1][2]["ratio_mean"] == pytest.approx(float(ratio.mean()), abs=1e-6)
    assert abs(seen[1][2]["ratio_mean"] - 1.0) > 1e-4
    assert seen[1][2]["approx_kl"] == pytest.approx(
        float(0.5 * ((torch.cat(new) - torch.cat(old)) ** 2).mean()), rel=1e-4
    )


def test_one_optimizer_step_per_mini_batch(tmp_path, monkeypatch):
    extra = {"rl.num_ppo_epochs": 2, "rl.num_mini_batches": 2}  # 8 rows x 2 micro-batches
    trainer = Trainer(small_config(loss="ppo", steps=2, **extra), tmp_path, progress=False)
    rows: list[int] = []
    per_step: list[int] = []

    def spying(self, batch, targets=None):
        rows.append(batch.batch_size)
        return ppo_call(self, batch, targets)

    def stepping():
        per_step.append(sum(rows))
        rows.clear()
        apply()

    ppo_call, apply = PPO.__call__, trainer.apply_gradients
    monkeypatch.setattr(PPO, "__call__", spying)
    trainer.apply_gradients = stepping
    trainer.train()
    assert per_step == [8] * 8  # 2 logged steps x 2 epochs x 2 mini-batches of 16 / 2 rows
    assert [r["ppo_updates"] for r in records(tmp_path)] == [4, 4]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 9), count=st.integers(1, 6))
def test_mini_batches_partition_the_rows(seed, size, count):
    rows = size * count
    rng, again = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(2):  # two epochs: a fresh permutation each, the same on every process
        parts = mini_batches(rng, rows, count)
        assert [len(p) for p in parts] == [size] * count
        assert all(np.all(np.diff(p) > 0) for p in parts)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(rows))
        same = mini_batches(again, rows, count)
        assert all(np.array_equal(p, q) for p, q in zip(parts, same, strict=True))
    if count > 1:
        with pytest.raises(ValueError, match="do not split"):
            mini_batches(rng, rows + 1, count)


def _rollout(rng: np.random.Generator, length: list[int], width: int) -> PPORollout:
    b = len(length)
    tau = torch.tensor(length)
    batch = Trajectories(
        "", torch.zeros(b, width - 1, dtype=torch.long), tau, (), (), (), None, 1.0, None
    )
    arrays = [torch.tensor(rng.normal(size=(b, width))) for _ in range(3)]
    old, values, refs = (torch.where(torch.arange(width) <= tau[:, None], a, 0.0) for a in arrays)
    return PPORollout(batch, torch.tensor(rng.uniform(-2, 5, size=b)), old, values, refs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_step_targets_whiten_over_the_whole_step(seed):
    rng = np.random.default_rng(seed)
    rollouts = [_rollout(rng, [2, 0, 3], 4), _rollout(rng, [1, 5], 6)]  # two widths
    objective = PPO(kl_coef=0.1, lam=0.9)
    adv, returns, kl = step_targets(objective, rollouts)
    assert tuple(adv.shape) == (5, 6)
    hand_adv, hand_ret, hand_kl = [], [], []
    for r in rollouts:
        for b, tau in enumerate(r.batch.length.tolist()):
            k1 = (r.old_log_probs[b, : tau + 1] - r.ref_log_probs[b, : tau + 1]).tolist()
            rewards = [-0.1 * k for k in k1]
            rewards[-1] += float(r.terminal[b])
            a, g = ref.gae_row(rewards, r.old_values[b, : tau + 1].tolist(), 1.0, 0.9)
            hand_adv.append(a)
            hand_ret.append(g)
            hand_kl.append(k1)
    whitened = ref.whiten([a for row in hand_adv for a in row], shift_mean=True)
    start = 0
    for i, (row_ret, row_kl) in enumerate(zip(hand_ret, hand_kl, strict=True)):
        n = len(row_ret)
        np.testing.assert_allclose(adv[i, :n], whitened[start : start + n], rtol=1e-9)
        np.testing.assert_allclose(returns[i, :n], row_ret, rtol=1e-9)
        np.testing.assert_allclose(kl[i, :n], row_kl, rtol=1e-9)
        assert not adv[i, n:].any() and not returns[i, n:].any()
        start += n


def test_mini_batches_that_do_not_split_the_rows_are_one_line_errors(tmp_path):
    cfg = small_config(loss="ppo", steps=1, **{"rl.num_mini_batches": 3})  # 2 x 8 rows
    with pytest.raises(TrainingError, match=r"16 rows per step.*rl\.num_mini_batches 3") as info:
        Trainer(cfg, tmp_path, progress=False)
    assert "\n" not in str(info.value)
    config = tmp_path / "ppo.toml"
    config.write_text("loss = 'ppo'\n[rl]\nnum_mini_batches = 3\n")
    args = ["train", "--config", str(config), "--steps", "1", "--batch-size", "8"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), "--no-progress"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "rl.num_mini_batches 3" in errors[0]
    assert "Traceback" not in result.output
    for field in ("num_ppo_epochs", "num_mini_batches"):
        with pytest.raises(ConfigError, match=rf"rl\.{field}"):
            build_config(overrides={"loss": "ppo", f"rl.{field}": 0})
