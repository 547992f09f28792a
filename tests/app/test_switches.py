"""The paper's ablation and sensitivity switches: reachable from a TOML file and from the CLI, and
each changes the objective, the buffer or the reward as specified (against the float64 references
of tests/core)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from raptb.adapters.tasks.expr24.task import Expr24Task
from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, TrainConfig, build_config
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.reward.schedule import RewardSchedule
from raptb.app.task_and_policy import build_policy
from raptb.app.training import train as train_module
from raptb.app.training import train_command
from raptb.app.training.gflownet.replay_items import new_items
from raptb.app.training.step import reward, sample_trajectories
from raptb.app.training.step_batch import stored_rows
from raptb.app.training.train import TrainResult
from raptb.app.training.train_command import kappa_line
from raptb.core.gfn.objectives import objective_by_name
from raptb.core.replay import make_buffer
from raptb.core.subm.select import subm_select
from raptb.core.subm.similarity import ShingleJaccardSimilarity
from tests.app.test_config_reference import BUILTIN_TASKS
from tests.core import reference as ref
from tests.core.test_objectives import close, make_batch, np_batch
from tests.core.test_replay import _expr_items

TOML = """
task = "expr24"
[objective]
absorb = false
target = "soft"
[replay]
kind = "subm"
subm_weights = [0.0, 0.0, 1.0, 0.0]
gating_ratio = 0.0
subm_method = "standard"
[reward]
kappa = 0.5
reward_scale = 5.0
reward_scale_end = 50.0
temperature = 1.5
temperature_end = 1.0
"""


@pytest.fixture
def from_toml(tmp_path: Path) -> TrainConfig:
    path = tmp_path / "run.toml"
    path.write_text(TOML, encoding="utf-8")
    return build_config(path, {"steps": 10})


def test_toml_reaches_every_switch(from_toml: TrainConfig) -> None:
    cfg = from_toml
    assert cfg.objective.absorb is False and cfg.objective.target == "soft"
    assert cfg.replay.subm_weights == (0.0, 0.0, 1.0, 0.0) and cfg.replay.gating_ratio == 0.0
    assert cfg.replay.similarity == "jaccard" and cfg.replay.shingle_k == 2  # the task's preset
    assert (cfg.reward.kappa, cfg.reward.reward_scale, cfg.reward.temperature) == (0.5, 5.0, 1.5)


@pytest.fixture
def seen(monkeypatch) -> list[TrainConfig]:
    """The configs ``raptb train`` hands to its trainer, which records them instead of training."""
    configs: list[TrainConfig] = []

    class Recorder:
        def __init__(self, cfg, run_dir, **kwargs):
            configs.append(cfg)
            self.run_dir = run_dir

        def train(self):
            return TrainResult(self.run_dir, 0, interrupted=False, checkpoint=None)

    # the command imports the trainer when it runs: patched where it is imported from
    monkeypatch.setattr(train_module, "Trainer", Recorder)
    return configs


def test_cli_flags_reach_the_run_config(tmp_path: Path, seen) -> None:
    args = ["train", "--out", str(tmp_path / "run"), "--no-absorb", "--subm-weights", "1", "0"]
    args += ["0", "1", "--kappa", "0.25", "--reward-scale", "7", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert cfg.objective.absorb is False and cfg.replay.subm_weights == (1.0, 0.0, 0.0, 1.0)
    assert (cfg.reward.kappa, cfg.reward.reward_scale) == (0.25, 7.0)
    assert "reward.kappa = 0.25" in result.output
    bad = CliRunner().invoke(app, [*args[:4], "--subm-weights", "1", "0", "0", "-1"])
    assert bad.exit_code == 2 and "replay.subm_weights" in bad.output


def test_every_config_field_has_a_flag_that_reaches_the_run_config(tmp_path, seen):
    from raptb.app.configuration.reference import config_fields

    # the flags as the parser declares them (the help text wraps with the terminal's width)
    train = typer.main.get_command(app).commands["train"]
    flags = {flag for param in train.params for flag in getattr(param, "opts", ())}
    short = {name.replace("_", "-") for name, _, _ in train_command.SHORT_FLAGS}
    # the built-in tasks' sections: a task registered by a test module imported after the
    # command line (tests/app/toy_task.py) has no flags in this process
    for path, _ in config_fields(BUILTIN_TASKS):
        assert f"--{path}" in flags or path.replace("_", "-") in short, path
    help_text = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "500"}).output
    assert "--optim.gradient_checkpointing" in help_text and "--tiny.width" in help_text
    # TOML values of every kind: a float, a list, a bool, a string, a nested section's field
    args = ["train", "--out", str(tmp_path / "run"), "--no-progress", "--objective.eta", "0.5"]
    args += ["--objective.k_min", "[5, 2]", "--optim.gradient_checkpointing", "true"]
    args += ["--sampling.decode", "eager", "--tiny.width", "32", "--replay.p_replay", "[0.4, 0.1]"]
    args += ["--lr", "2e-3", "--keep_checkpoints", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert (cfg.objective.eta, cfg.objective.k_min, cfg.optim.lr) == (0.5, (5, 2), 2e-3)
    assert cfg.optim.gradient_checkpointing is True and cfg.sampling.decode == "eager"
    assert (cfg.tiny.width, cfg.replay.p_replay, cfg.keep_checkpoints) == (32, (0.4, 0.1), 3)
    twice = CliRunner().invoke(app, [*args[:4], "--lr", "1e-3", "--optim.lr", "2e-3"])
    assert twice.exit_code == 2 and "optim.lr: given twice" in twice.output
    bad = CliRunner().invoke(app, [*args[:4], "--objective.eta", "lots"])
    assert bad.exit_code == 2 and "objective.eta" in bad.output


def test_absorb_false_gives_the_reference_objective_without_absorption(from_toml) -> None:
    objective = objective_by_name(from_toml.loss, **from_toml.objective_kwargs())
    d = make_batch(5, 6, 9)
    loss, _ = objective(np_batch(d), 0.3, step=0)
    want, _ = ref.raptb(d, 0.3, absorb=False, target="soft", k_min=7)
    assert close(loss, want)
    with_absorb, _ = ref.raptb(d, 0.3, absorb=True, target="soft", k_min=7)
    assert not close(loss, with_absorb)


def test_subm_weights_and_selection_options_shape_the_buffer(from_toml) -> None:
    replay = from_toml.replay.model_copy(update={"capacity": 12})
    buffer = make_buffer("subm", **replay.buffer_kwargs())
    assert (buffer.w_rew, buffer.w_val, buffer.w_div, buffer.w_len) == (0.0, 0.0, 1.0, 0.0)
    assert buffer.method == "standard" and buffer.gating_ratio == 0.0
    items = _expr_items(np.random.default_rng(4), 40)
    buffer.add(items)
    ground = {}
    for it in items:
        if it.key not in ground or it.terminal_log_r > ground[it.key].terminal_log_r:
            ground[it.key] = it
    cand = list(ground.values())
    sim = ShingleJaccardSimilarity(2).pairwise([c.text for c in cand], [c.text for c in cand])
    # diversity-only: no static score at all, whatever the items' rewards and validity
    want = subm_select(sim, np.zeros(len(cand)), np.zeros(len(cand), dtype=np.int64), 12)
    assert [it.text for it in buffer.items()] == [cand[i].text for i in want]


def test_rp_and_prt_options_reach_their_buffers(tmp_path: Path) -> None:
    path = tmp_path / "prt.toml"
    path.write_text('[replay]\nkind = "prt"\nrp_tolerance = 0.5\nprt_alpha = 0.4\nprt_beta = 0.5\n')
    replay = build_config(path).replay
    rp = make_buffer("rp", **replay.model_copy(update={"kind": "rp"}).buffer_kwargs())
    prt = make_buffer("prt", **replay.buffer_kwargs())
    assert rp.tolerance == 0.5 and (prt.tolerance, prt.alpha, prt.beta) == (0.5, 0.4, 0.5)


def test_reward_schedule_is_lambda_over_temperature_linear_in_the_step(from_toml) -> None:
    schedule = RewardSchedule(from_toml.reward, from_toml.schedule_horizon)
    for step, lam, temp in ((0, 5.0, 1.5), (5, 27.5, 1.25), (10, 50.0, 1.0), (20, 50.0, 1.0)):
        weights = schedule.at(step)
        assert weights.scale == pytest.approx(lam / temp, rel=1e-15)
        assert weights.kappa == pytest.approx(0.5 / temp, rel=1e-15)
        assert weights.rescore  # scheduled: replayed rows are scored again
    constant = RewardSchedule(build_config().reward, 10).at(3)
    assert (constant.scale, constant.kappa, constant.rescore) == (50.0, 0.0, False)


def test_the_reward_stage_applies_the_scale_and_rescores_replayed_rows() -> None:
    task = Expr24Task()
    policy = build_policy("tiny", task, 0)
    scorer = PrefixScorer(task, policy, 50.0)
    batch = sample_trajectories(
        policy, task, task.prompts()[0], 8, 1.0, torch.Generator().manual_seed(0)
    )
    scaled = reward(scorer, policy, batch, 0.0, scale=5.0)
    for b, row in enumerate(batch.rows):
        want = [5.0 * task.score("", t).value for t in scorer.texts(row)]
        assert scaled.u_host[b, : len(row) + 1].tolist() == want
    buffer = make_buffer("rp", capacity=50)
    buffer.add(new_items(task, batch, scaled))
    prompt = task.prompts()[0]
    items = buffer.sample(8, np.random.default_rng(0), prompt)
    drawn = stored_rows(policy, prompt, items, task.max_length, replayed=True)
    stored = reward(scorer, policy, drawn, 0.0, scale=20.0)
    assert stored.u_host is drawn.stored_u  # reused: lambda at storage time (5)
    again = reward(scorer, policy, drawn, 0.0, scale=20.0, rescore=True)
    np.testing.assert_array_equal(again.u_host, 4.0 * drawn.stored_u)


def test_pretrained_models_get_kappa_1_on_expr24_and_tiny_keeps_0() -> None:
    tiny = build_config(overrides={"task": "expr24"})
    pretrained = build_config(overrides={"task": "expr24", "model": "smollm2-135m"})
    chosen = build_config(overrides={"model": "smollm2-135m", "reward.kappa": 0.0})
    assert (tiny.reward.kappa, pretrained.reward.kappa, chosen.reward.kappa) == (0.0, 1.0, 0.0)
    assert "from scratch" in kappa_line(tiny) and "as in the paper" in kappa_line(pretrained)
    assert "against the paper" in kappa_line(chosen)


def test_invalid_switch_values_are_one_line_errors() -> None:
    for key, value in (
        ("replay.subm_weights", [1.0, 1.0, 1.0]),
        ("replay.gating_ratio", 1.5),
        ("replay.subm_method", "stochastic"),
        ("reward.temperature", 0.0),
        ("objective.absorb", "maybe"),
    ):
        with pytest.raises(ConfigError, match=key.split(".")[1]):
            build_config(overrides={key: value})


def test_evaluation_scores_u_at_the_end_of_the_reward_schedules(tmp_path: Path) -> None:
    # lambda 5 -> 20 and T_R 2 -> 0.5: the sampler is trained towards u = (20 / 0.5) S, which
    # is what evaluation must report, not the schedule's start (5 / 2) S
    run = tmp_path / "run"
    args = ["train", "--task", "custom", "--reward", "tests.app.flaky_rewards:count_a"]
    args += ["--steps", "1", "--batch-size", "4", "--grad-accum", "1", "--out", str(run)]
    config = tmp_path / "schedules.toml"
    config.write_text(
        "[reward]\nreward_scale = 5.0\nreward_scale_end = 20.0\n"
        "temperature = 2.0\ntemperature_end = 0.5\n"
        '[custom]\nalphabet = "ab"\nmax_length = 4\n'
    )
    trained = CliRunner().invoke(app, [*args, "--config", str(config), "--no-progress"])
    assert trained.exit_code == 0, trained.output
    evaluated = CliRunner().invoke(app, ["eval", str(run), "--samples", "16"])
    assert evaluated.exit_code == 0, evaluated.output
    rows = [json.loads(x) for x in (run / "eval" / "samples.jsonl").read_text().splitlines()]
    assert any(row["score"] > 0 for row in rows)  # the check below is not vacuous
    for row in rows:
        want = [40.0 * row["text"][:k].count("a") / 5.0 for k in range(row["length"] + 1)]
        np.testing.assert_allclose(row["u"], want, atol=1e-9)
