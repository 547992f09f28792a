"""RL baselines through the trainer: GRPO and PPO runs, resume, the group-advantage wiring, CLI."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.run_dir.checkpoint import _seal as seal
from raptb.app.training.rl.grpo import GRPOAlgorithm
from raptb.app.training.rl.ppo import PPOAlgorithm
from raptb.app.training.rl.rl_step import rl_loss_step, sequence_rewards
from raptb.app.training.step import Rewards, sample_trajectories
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import RLBatch
from raptb.core.rl.grpo import CISPO_EPSILON_HIGH, GRPO
from raptb.core.rl.ppo import PPO
from tests.app.test_train import records, small_config, weights


@pytest.mark.parametrize(
    ("loss", "extra"),
    [
        ("grpo", {}),
        ("grpo", {"rl.beta": 0.04, "rl.num_generations": 4}),
        ("ppo", {"rl.num_ppo_epochs": 1}),
    ],
)
def test_rl_losses_train(tmp_path, loss, extra):
    # seed 1: a step's rows are drawn in a new order (one rollout per step), and with seed 0 no
    # row of the two steps is correct, so every GRPO advantage is 0 and nothing would move
    config = small_config(loss=loss, steps=2, seed=1, **extra)
    trainer = Trainer(config, tmp_path, progress=False)
    family = PPOAlgorithm if loss == "ppo" else GRPOAlgorithm
    assert isinstance(trainer, Trainer) and isinstance(trainer.algorithm, family)
    # no logZ, no buffer: the optimizer holds the policy (and PPO's value head) only
    assert not hasattr(trainer.algorithm, "log_z") and not hasattr(trainer.algorithm, "buffer")
    groups = trainer.optimizer.param_groups
    assert len(groups) == (2 if loss == "ppo" else 1)
    before = weights(trainer)
    result = trainer.train()
    assert result.step == 2
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == [1, 2]
    for r in logged:
        assert math.isfinite(r["loss"]) and math.isfinite(r["reward_mean"])
        assert r["reward_std"] >= 0 and r["clip_frac"] == 0.0  # one pass: every ratio is 1
        assert 0 <= r["acc"] <= 1
    after = trainer.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert "log_z" not in torch.load(result.checkpoint / "trainer.pt", weights_only=True)
    kl_on = loss == "ppo" or "rl.beta" in extra
    assert all((r["kl"] is not None) == kl_on for r in logged)
    if loss == "ppo":
        assert all(math.isfinite(r["value_loss"]) for r in logged)
        saved = torch.load(result.checkpoint / "trainer.pt", weights_only=True)
        head = trainer.algorithm.value_head.state_dict()
        assert all(torch.equal(saved["value_head"][k], head[k]) for k in head)
    else:
        assert not hasattr(trainer.algorithm, "value_head")


@pytest.mark.parametrize(
    ("loss", "extra"),
    [("grpo", {}), ("ppo", {}), ("ppo", {"rl.num_mini_batches": 2}), ("flowrl", {"seed": 1})],
)
def test_resume_equals_uninterrupted_rl_run(tmp_path, loss, extra):
    cfg = small_config(loss=loss, steps=4, **extra)  # PPO: 4 epochs (TRL's default)
    straight = Trainer(cfg, tmp_path / "a", progress=False)
    straight.train()
    first = Trainer(cfg, tmp_path / "b", progress=False)
    assert first.train(stop_at=2).step == 2
    resumed = Trainer(cfg, tmp_path / "b", resume=True, progress=False)
    assert resumed.step == 2
    resumed.train()
    a, b = straight.policy.model.state_dict(), resumed.policy.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    if loss == "flowrl":  # log Z and its Adam state come back from trainer.pt (seed 1: with no
        # correct row, as at seed 0, every advantage is 0 and pi = pi_ref leaves no residual)
        assert float(straight.algorithm.log_z) != 0.0
        assert torch.equal(straight.algorithm.log_z, resumed.algorithm.log_z)
    if loss == "ppo":
        va, vb = (
            straight.algorithm.value_head.state_dict(),
            resumed.algorithm.value_head.state_dict(),
        )
        assert all(torch.equal(va[k], vb[k]) for k in va)
    drop = ("seconds",)
    ra = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "a")]
    rb = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "b")]
    assert ra == rb


def _fixed_batch(trainer: Trainer, terminal: list[float]):
    """A rollout of the trainer's policy with known terminal rewards u_tau (0 elsewhere)."""
    generator = torch.Generator().manual_seed(3)
    prompt = trainer.task.prompts()[0]
    batch = sample_trajectories(trainer.policy, trainer.task, prompt, len(terminal), 1.0, generator)
    u = torch.zeros(len(terminal), batch.tokens.shape[1] + 1)
    u[torch.arange(len(terminal)), batch.length] = torch.tensor(terminal)
    rewards = Rewards(u_host=u.double().numpy(), scores=None, u=u, prior=None, log_r=u)
    return batch, rewards


def _sequence_log_probs(trainer: Trainer, batch) -> list[torch.Tensor]:
    """log pi(x) per row, by hand: sum of the token log-probs then the stop's, row by row."""
    log_pf, log_pterm = trainer.policy.score(batch.prompt, batch.tokens, batch.length)
    out = []
    for b, tau in enumerate(batch.length.tolist()):
        out.append(log_pf[b, :tau].sum() + log_pterm[b, tau])
    return out


def _param_grads(trainer: Trainer) -> list[torch.Tensor]:
    return [p.grad.clone() for p in trainer.policy.model.parameters() if p.grad is not None]


def test_group_advantage_wiring_matches_hand_computed_grpo(tmp_path):
    cfg = small_config(loss="grpo", steps=1, **{"rl.num_generations": 4})
    trainer = Trainer(cfg, tmp_path, progress=False)
    trainer.policy.model.eval()  # no dropout: the hand computation rescores the same values
    terminal = [50.0, 0.0, 0.0, 10.0, 3.0, 3.0, 3.0, 3.0]  # the second group has std 0
    batch, rewards = _fixed_batch(trainer, terminal)
    picked = sequence_rewards(rewards, batch.length, "task")
    assert picked.tolist() == terminal

    trainer.optimizer.zero_grad(set_to_none=True)
    result = rl_loss_step(trainer.policy, trainer.algorithm.objective, [(batch, picked)], 1.0)
    trainer_grads = _param_grads(trainer)
    assert trainer_grads and any(bool(g.abs().sum() > 0) for g in trainer_grads)

    # hand: A = (r - group mean) / (Bessel std + 1e-4); dapo = -sum_b A_b (tau_b + 1) / sum (tau+1)
    groups = np.array(terminal).reshape(2, 4)
    adv = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + 1e-4)
    adv = adv.reshape(-1)
    actions = batch.length.numpy() + 1
    assert result.loss == pytest.approx(-(adv * actions).sum() / actions.sum(), abs=1e-6)
    assert result.diagnostics["frac_reward_zero_std"] == 0.5

    # the gradient is that of -sum_b A_b log pi(x_b) / sum_b (tau_b + 1)
    trainer.optimizer.zero_grad(set_to_none=True)
    seq = _sequence_log_probs(trainer, batch)
    surrogate = -sum(float(a) * s for a, s in zip(adv, seq, strict=True)) / float(actions.sum())
    surrogate.backward()
    for mine, hand in zip(trainer_grads, _param_grads(trainer), strict=True):
        torch.testing.assert_close(mine, hand, rtol=1e-4, atol=1e-6)

    # core GRPO on an RLBatch built by hand from the same log-probs gives the same loss
    log_pf, log_pterm = trainer.policy.score(batch.prompt, batch.tokens, batch.length)
    rows = torch.zeros(len(terminal), batch.tokens.shape[1] + 1)
    for b, tau in enumerate(batch.length.tolist()):
        rows[b, :tau] = log_pf[b, :tau]
        rows[b, tau] = log_pterm[b, tau]
    hand_batch = RLBatch(rows, rows.detach(), torch.tensor(terminal), batch.length)
    core_loss, _ = GRPO(num_generations=4)(hand_batch)
    assert result.loss == pytest.approx(float(core_loss.detach()), abs=1e-6)


def test_ppo_wiring_uses_the_value_head_and_terminal_reward(tmp_path):
    cfg = small_config(loss="ppo", steps=1, **{"rl.kl_coef": 0.0, "rl.lam": 1.0})
    trainer = Trainer(cfg, tmp_path, progress=False)
    trainer.policy.model.eval()
    trainer.algorithm.value_head.eval()
    terminal = [50.0, 0.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    batch, rewards = _fixed_batch(trainer, terminal)
    picked = sequence_rewards(rewards, batch.length, "task")
    result = rl_loss_step(
        trainer.policy,
        trainer.algorithm.objective,
        [(batch, picked)],
        1.0,
        value_head=trainer.algorithm.value_head,
    )
    # independent: with gamma = lam = 1 the GAE return at every state t <= tau is R_b (no KL
    # term), so the
    # unclipped value loss (V = V_old at the first pass) is 0.5 mean_m (V_t - R_b)^2
    _, _, hidden = trainer.policy.score_with_hidden(batch.prompt, batch.tokens, batch.length)
    p = len(trainer.policy.prompt_ids(batch.prompt))
    squares = []
    for b, tau in enumerate(batch.length.tolist()):
        values = trainer.algorithm.value_head(hidden[b, p - 1 : p + tau])
        squares.extend(((values - terminal[b]) ** 2).tolist())
    assert result.diagnostics["value_loss"] == pytest.approx(0.5 * np.mean(squares), rel=1e-5)
    assert result.diagnostics["kl"] != result.diagnostics["kl"]  # nan: no reference evaluated
    assert isinstance(trainer.algorithm.objective, PPO) and trainer.algorithm.objective.gamma == 1.0
    assert trainer.algorithm.objective.lam == 1.0


def test_rl_config_defaults_and_errors(tmp_path):
    cfg = build_config(overrides={"loss": "grpo"})
    assert cfg.replay.kind == "none"
    kwargs = cfg.objective_kwargs()
    assert GRPO(**kwargs) == GRPO()  # TRL's defaults, written once in core
    assert set(build_config(overrides={"loss": "ppo"}).objective_kwargs()) <= set(
        PPO.__dataclass_fields__
    )
    cispo = build_config(overrides={"loss": "grpo", "rl.loss_type": "cispo"})
    assert cispo.objective_kwargs()["epsilon_high"] == CISPO_EPSILON_HIGH
    with pytest.raises(ConfigError, match="replay 'none' only") as info:
        build_config(overrides={"loss": "grpo", "replay.kind": "subm"})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"multiple of rl\.num_generations"):
        build_config(overrides={"loss": "grpo", "optim.batch_size": 12, "optim.grad_accum": 1})
    with pytest.raises(ConfigError, match=r"rl\.num_generations"):
        build_config(overrides={"loss": "grpo", "rl.num_generations": 1})
    assert build_config(overrides={"loss": "raptb"}).replay.kind == "subm"


def test_cli_trains_grpo_and_refuses_replay(tmp_path):
    runner = CliRunner()
    run = tmp_path / "run"
    args = ["train", "--loss", "grpo", "--steps", "1", "--batch-size", "8", "--grad-accum", "1"]
    ok = runner.invoke(app, [*args, "--out", str(run), "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert records(run)[0]["step"] == 1
    bad = runner.invoke(app, [*args, "--replay", "prt", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "replay 'none' only" in bad.output


def test_smiles_grpo_smoke(tmp_path):
    cfg = small_config(task="smiles", loss="grpo", steps=2)
    trainer = Trainer(cfg, tmp_path, progress=False)
    assert trainer.train().step == 2
    assert all(math.isfinite(r["loss"]) for r in records(tmp_path))


def test_rl_rewards_follow_the_reward_schedules(tmp_path, monkeypatch):
    # lambda 5 -> 20 and T_R 2 -> 1 over 3 steps: step t's task reward weight is lambda(t) / T_R(t)
    import raptb.app.training.rl.rollout as rl_rollout

    seen: list[float] = []

    def recording(scorer, policy, batch, kappa, scale=None, rescore=False):
        seen.append(scale)
        return reward_stage(scorer, policy, batch, kappa, scale, rescore)

    reward_stage = rl_rollout.reward
    monkeypatch.setattr(rl_rollout, "reward", recording)
    extra = {"reward.reward_scale_end": 20.0, "reward.temperature": 2.0}
    extra |= {"reward.reward_scale": 5.0, "reward.temperature_end": 1.0}
    cfg = small_config(loss="grpo", steps=3, **extra)
    Trainer(cfg, tmp_path, progress=False).train()
    per_step = len(seen) // 3
    lam, temp = (
        [5.0, 10.0, 15.0],
        [2.0, 5 / 3, 4 / 3],
    )  # value at step t: start + (end - start) t / 3
    want = [lam[t] / temp[t] for t in range(3) for _ in range(per_step)]
    assert seen == pytest.approx(want)


@pytest.mark.parametrize(
    ("loss", "over", "copied"),
    [
        ("grpo", {}, False),  # task reward, beta 0: nothing reads the reference
        ("grpo", {"rl.beta": 0.04}, True),  # the KL penalty does
        ("grpo", {"rl.reward": "log_r"}, True),  # so does kappa log P_ref in log R
        ("ppo", {}, True),  # kl_coef 0.05 by default
        ("raptb", {}, True),  # the GFlowNet reward's prior
    ],
)
def test_a_frozen_reference_copy_is_taken_only_when_read(tmp_path, loss, over, copied):
    """Full fine-tuning with kappa 1: the trainer copies the model as its reference only when
    the loss or the reward reads it (a whole second model otherwise wasted)."""
    config = small_config(loss=loss, **{"reward.kappa": 1.0, **over})
    trainer = Trainer(config, tmp_path, progress=False)
    assert (trainer.policy.reference_copy is not None) == copied


@pytest.mark.parametrize("loss", ["grpo", "ppo"])
def test_a_checkpoint_with_the_former_unused_log_z_group_resumes_exactly(tmp_path, loss):
    """RL checkpoints written before the algorithms had their own classes held an untrained logZ
    as the optimizer's second group and ``log_z`` in trainer.pt: they resume as if without it."""
    cfg = small_config(loss=loss, steps=4, checkpoint_every=2, **{"rl.num_ppo_epochs": 2})
    Trainer(cfg, tmp_path / "a", progress=False).train(stop_at=2)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    pt = tmp_path / "b" / "checkpoints" / "step-000002" / "trainer.pt"
    saved = torch.load(pt, weights_only=True)
    groups = saved["optimizer"]["param_groups"]
    n0 = len(groups[0]["params"])  # the policy's group: parameters 0 .. n0 - 1
    # the former layout: logZ (one parameter, number n0, with its Adam state) as group 1, the
    # value head's parameters (PPO) one number later
    later = [{**g, "params": [i + 1 for i in g["params"]]} for g in groups[1:]]
    old_groups = [groups[0], {**groups[0], "params": [n0], "lr": 0.1}, *later]
    state = {(k if k < n0 else k + 1): v for k, v in saved["optimizer"]["state"].items()}
    zero = torch.zeros(())
    state[n0] = {"step": torch.tensor(2.0), "exp_avg": zero, "exp_avg_sq": zero}
    saved["optimizer"] = {"state": state, "param_groups": old_groups}
    saved["log_z"] = torch.tensor(0.0)
    torch.save(saved, pt)
    seal(pt.parent)  # the manifest of the rewritten checkpoint, as the writer seals one
    for run in ("a", "b"):
        Trainer(cfg, tmp_path / run, resume=True, progress=False).train()
    assert records(tmp_path / "a") != [] and len(records(tmp_path / "b")) == 4
    drop = ("seconds",)
    ra = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "a")]
    rb = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "b")]
    assert ra == rb
