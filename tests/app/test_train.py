"""Training loop: smoke runs per objective and replay, resume equality, interrupts, errors."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.run_dir.checkpoint import list_checkpoints
from raptb.app.training.train import Trainer, TrainingError
from raptb.core.gfn.objectives import OBJECTIVES

SMALL = {"optim.batch_size": 8, "optim.grad_accum": 2, "threads": 1, "checkpoint_every": 2}


def small_config(**over):
    return build_config(overrides={**SMALL, **over})


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def changed(before: dict[str, torch.Tensor], trainer: Trainer) -> bool:
    after = trainer.policy.model.state_dict()
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("loss", sorted(OBJECTIVES))
def test_every_objective_trains(tmp_path, loss):
    trainer = Trainer(
        small_config(loss=loss, steps=2, **{"replay.kind": "rp"}), tmp_path, progress=False
    )
    before = weights(trainer)
    result = trainer.train()
    assert result.step == 2 and not result.interrupted
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in logged)
    assert changed(before, trainer)


@pytest.mark.parametrize("replay", ["none", "rp", "prt", "subm", "subm-dispersion", "oracle"])
def test_every_replay_trains(tmp_path, replay):
    kind, _, diversity = replay.partition("-")
    # seed 4: one rollout per step draws the rows in a new order, and with seed 0 no row of the
    # first steps is correct, so SubM (Expr24 keeps correct rows only) would have nothing to hold
    options = {"replay.kind": kind, "replay.p_replay": (0.9, 0.9)}
    if kind == "subm":  # another kind refuses SubM's options
        options["replay.subm_diversity"] = diversity or "facility"
    cfg = small_config(steps=3, seed=4, **options)
    trainer = Trainer(cfg, tmp_path, progress=False)
    before = weights(trainer)
    trainer.train()
    logged = records(tmp_path)
    assert all(math.isfinite(r["loss"]) for r in logged)
    assert changed(before, trainer)
    if replay == "none":
        assert all(r["replay_frac"] == 0 for r in logged) and trainer.algorithm.buffer is None
    else:
        assert len(trainer.algorithm.buffer) > 0
        assert any(r["replay_frac"] > 0 for r in logged)  # 0.9 replay after the first fill
    if kind == "subm":
        assert trainer.algorithm.buffer.config()["diversity"] == (diversity or "facility")


def test_oracle_buffer_holds_the_enumerated_solutions(tmp_path):
    trainer = Trainer(small_config(steps=1, **{"replay.kind": "oracle"}), tmp_path, progress=False)
    assert len(trainer.algorithm.buffer) == 75_445
    item = trainer.algorithm.buffer.sample(1, trainer.rng)[0]
    assert item.u[-1] == 50.0 and item.valid


def test_every_loss_entry_names_an_algorithm_of_the_loops_shape():
    from raptb.app.configuration.losses import LOSSES
    from raptb.app.training.gflownet.algorithm import GFlowNetAlgorithm

    rl_losses = {"grpo", "ppo", "dapo", "passk", "ucpo", "g2rpo", "ips_grpo", "rover", "flowrl"}
    assert set(OBJECTIVES) | rl_losses <= set(LOSSES)
    for name, loss in LOSSES.items():
        algorithm = loss.algorithm_class()
        for method in ("param_groups", "uses_reference", "optimizer_step", "extra_state"):
            assert callable(getattr(algorithm, method)), (name, method)
        assert (algorithm is GFlowNetAlgorithm) == (name in OBJECTIVES), name
        assert loss.replay == (loss.section == "objective"), name


def test_log_z_has_its_own_float32_group(tmp_path):
    trainer = Trainer(small_config(steps=1, **{"optim.log_z_lr": 0.5}), tmp_path, progress=False)
    groups = trainer.optimizer.param_groups
    assert groups[1]["params"] == [trainer.algorithm.log_z] and groups[1]["lr"] == 0.5
    assert trainer.algorithm.log_z.dtype == torch.float32
    start = float(trainer.algorithm.log_z)
    trainer.train()
    assert float(trainer.algorithm.log_z) != start


@pytest.mark.parametrize("replay", ["subm", "prt"])
def test_resume_equals_uninterrupted_run(tmp_path, replay):
    # seed 4: with seed 0 the new draw order (one rollout per step) gives no correct row, and
    # SubM's buffer (correct Expr24 rows only) would stay empty
    cfg = small_config(steps=4, seed=4, **{"replay.kind": replay})
    straight = Trainer(cfg, tmp_path / "a", progress=False)
    straight.train()

    first = Trainer(cfg, tmp_path / "b", progress=False)
    assert first.train(stop_at=2).step == 2
    resumed = Trainer(cfg, tmp_path / "b", resume=True, progress=False)
    assert resumed.step == 2
    resumed.train()

    a, b = straight.policy.model.state_dict(), resumed.policy.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(straight.algorithm.log_z.detach(), resumed.algorithm.log_z.detach())
    drop = ("seconds",)
    ra = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "a")]
    rb = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "b")]
    assert ra == rb
    assert [it.tokens for it in straight.algorithm.buffer.items()] == [
        it.tokens for it in resumed.algorithm.buffer.items()
    ]


def test_checkpoints_are_pruned_and_complete(tmp_path):
    trainer = Trainer(small_config(steps=6, keep_checkpoints=2), tmp_path, progress=False)
    trainer.train()
    kept = list_checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step-000004", "step-000006"]
    for folder in kept:
        assert {"model", "trainer.pt", "state.json", "arrays.npz"} <= {
            p.name for p in folder.iterdir()
        }
        assert (folder / "model" / "model.safetensors").is_file()
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, as in a terminal: a shell starts background jobs (``pytest
    &``, nohup) with SIGINT ignored, and the trainer leaves an ignored signal ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_finishes_the_step_and_checkpoints(tmp_path, monkeypatch):
    trainer = Trainer(small_config(steps=5, checkpoint_every=100), tmp_path, progress=False)
    real = trainer._optimizer_step

    def step_then_interrupt():
        out = real()
        os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(trainer, "_optimizer_step", step_then_interrupt)
    result = trainer.train()
    assert result.interrupted and result.step == 1
    assert result.checkpoint is not None and result.checkpoint.name == "step-000001"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _signals_after_the_first_step(trainer, monkeypatch, *signums: int) -> None:
    real = trainer._optimizer_step

    def step_then_signal():
        out = real()
        if trainer.step == 0:
            for signum in signums:
                os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(trainer, "_optimizer_step", step_then_signal)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_sigint_after_sigterm_aborts(tmp_path, monkeypatch):
    trainer = Trainer(small_config(steps=5, checkpoint_every=100), tmp_path, progress=False)
    _signals_after_the_first_step(trainer, monkeypatch, signal.SIGTERM, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert list_checkpoints(tmp_path) == []


def test_non_finite_losses_are_skipped_then_stop(tmp_path, monkeypatch):
    trainer = Trainer(small_config(steps=5, max_nonfinite=3), tmp_path, progress=False)
    monkeypatch.setattr(trainer, "_optimizer_step", lambda: None)
    with pytest.raises(TrainingError, match="3 consecutive steps had a non-finite loss"):
        trainer.train()
    assert trainer.step == 0 and trainer.nonfinite_total == 3


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(TrainingError, match="no checkpoint"):
        Trainer(small_config(steps=1), tmp_path, resume=True, progress=False)


def test_config_file_and_flags(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('loss = "tb"\nsteps = 7\n[optim]\nlr = 0.01\n')
    cfg = build_config(file, {"steps": 9, "optim.batch_size": 4})
    assert (cfg.loss, cfg.steps, cfg.optim.lr, cfg.optim.batch_size) == ("tb", 9, 0.01, 4)
    assert "k_min" not in cfg.objective_kwargs() and cfg.objective_kwargs() == {}
    assert cfg.model_copy(update={"loss": "raptb"}).objective_kwargs()["k_min"].start == 7


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("steps = 0\n", "steps"),
        ("[optim]\nlr = -1.0\n", "optim.lr"),
        ("[objective]\nalpha = 2.0\n", "objective.alpha"),
        ('[replay]\nkind = "best"\n', "replay.kind"),
        ('[replay]\nsubm_diversity = "coverage"\n', "replay.subm_diversity"),
        ("bogus = 1\n", "bogus"),
        ("steps = [\n", "not valid TOML"),
    ],
)
def test_config_errors_name_the_field(tmp_path, text, field):
    file = tmp_path / "bad.toml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=field) as info:
        build_config(file)
    assert "\n" not in str(info.value).strip()


def test_cli_train_and_errors(tmp_path):
    runner = CliRunner()
    run = tmp_path / "run"
    args = ["train", "--steps", "2", "--batch-size", "4", "--grad-accum", "1", "--out", str(run)]
    ok = runner.invoke(app, [*args, "--no-progress", "--loss", "tb", "--replay", "rp"])
    assert ok.exit_code == 0, ok.output
    assert (run / "config.toml").is_file() and len(records(run)) == 2
    again = runner.invoke(app, [*args, "--no-progress"])
    assert again.exit_code == 2 and "already holds a run" in again.output
    more = runner.invoke(
        app, ["train", "--resume", "--out", str(run), "--steps", "3", "--no-progress"]
    )
    assert more.exit_code == 0, more.output
    assert [r["step"] for r in records(run)] == [1, 2, 3]
    bad = runner.invoke(app, ["train", "--loss", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "invalid config: loss" in bad.output
    neg = runner.invoke(app, ["train", "--lr", "-1", "--out", str(tmp_path / "y")])
    assert neg.exit_code == 2 and "optim.lr" in neg.output


def test_replay_falls_back_to_on_policy_for_a_prompt_without_items(tmp_path):
    # Two prompts, one per step (rows_per_prompt = the step's 16 rows); the buffer fills for the
    # first before the second is ever visited, so a replay draw for the second must sample
    # on-policy instead of failing on an empty store; the third step replays the first's rows.
    scaffolds = tmp_path / "scaffolds.smi"
    scaffolds.write_text("O=C1Nc2cc(*)ccc2N1\nc1ccc(*)cc1\n")
    cfg = small_config(
        task="smiles",
        steps=3,
        **{
            "smiles.scaffolds": str(scaffolds),
            "replay.kind": "rp",
            "replay.p_replay": (1.0, 1.0),
            "optim.rows_per_prompt": 16,
        },
    )
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    trainer.train()
    logged = records(tmp_path / "run")
    assert len(logged) == 3 and all(math.isfinite(r["loss"]) for r in logged)
    assert logged[0]["replay_frac"] == 0.0  # step 1: nothing stored for either prompt yet
    assert logged[1]["replay_frac"] == 0.0  # step 2: nothing stored for the second prompt
    assert logged[2]["replay_frac"] in (0.5, 1.0)


def test_oracle_rows_do_not_count_as_on_policy_samples(tmp_path):
    # Every on-policy row replaced by an oracle solution: the policy sampled nothing, so the
    # logged on-policy accuracy is undefined rather than a misleading 0 or 1.
    over = {
        "replay.kind": "oracle",
        "replay.p_replay": (0.0, 0.0),
        "replay.p_oracle": (1.0, 1.0),
        "replay.oracle_fraction": 1.0,
    }
    trainer = Trainer(small_config(steps=2, **over), tmp_path, progress=False)
    trainer.train()
    assert [r["acc"] for r in records(tmp_path)] == [None, None]
    assert trainer.correct_seen == set()


@pytest.mark.parametrize("lora", [0, 4])
def test_gradient_checkpointing_trains_as_without_it(tmp_path, lora):
    # [optim] gradient_checkpointing on the embedded model, full fine-tuning and LoRA: the
    # rescoring blocks checkpoint, and 2 steps (rollouts, replay, updates) log what they log without
    logs = []
    for on in (False, True):
        cfg = small_config(steps=2, **{"optim.gradient_checkpointing": on, "lora.rank": lora})
        trainer = Trainer(cfg, tmp_path / f"{on}", progress=False)
        # a checkpointed rescoring takes the model's own forward over every row's prompt: both
        # sides take it, as a sharded model's (step_together set; one process here), so that the
        # two differ by the checkpointing alone (the other paths are held to that forward by
        # tests/adapters/test_one_path.py)
        trainer.policy.step_together = lambda done: done
        blocks = [m for m in trainer.policy.model.modules() if type(m).__name__ == "GPT2Block"]
        assert len(blocks) == 2 and all(b.gradient_checkpointing == on for b in blocks)
        trainer.train()
        logs.append(
            [{k: v for k, v in r.items() if k != "seconds"} for r in records(trainer.run_dir)]
        )
    plain, checked = logs
    assert [r["step"] for r in checked] == [1, 2]
    for a, b in zip(plain, checked, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_tiny_section_shapes_the_embedded_model_and_evaluation_reads_it(tmp_path):
    config = small_config(steps=1, **{"tiny.layers": 3, "tiny.width": 48, "tiny.heads": 6})
    trainer = Trainer(config, tmp_path, progress=False)
    shape = trainer.policy.model.config
    assert (shape.n_layer, shape.n_embd, shape.n_head) == (3, 48, 6)
    trainer.train()
    saved = json.loads((list_checkpoints(tmp_path)[-1] / "model" / "config.json").read_text())
    assert (saved["n_layer"], saved["n_embd"], saved["n_head"]) == (3, 48, 6)
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--samples", "4", "--json"])
    assert result.exit_code == 0, result.output
    with pytest.raises(
        ConfigError, match=r"tiny: .*width \(50\) must be a multiple of heads \(4\)"
    ):
        small_config(**{"tiny.width": 50})


def test_log_z_lr_0_holds_log_z_at_its_initial_value(tmp_path):
    held = Trainer(
        small_config(steps=2, **{"optim.log_z_lr": 0.0, "optim.log_z_init": 0.25}),
        tmp_path / "held",
        progress=False,
    )
    held.train()
    assert held.algorithm.log_z.item() == 0.25
    assert [r["log_z"] for r in records(tmp_path / "held")] == [0.25, 0.25]
    trained = Trainer(
        small_config(steps=2, **{"optim.log_z_lr": 0.1, "optim.log_z_init": 0.25}),
        tmp_path / "trained",
        progress=False,
    )
    trained.train()
    assert trained.algorithm.log_z.item() != 0.25
    # the embedded model holds logZ unless told otherwise; a pretrained one trains it
    assert small_config().optim.log_z_lr == 0.0
    assert small_config(model="some/pretrained-model").optim.log_z_lr == 0.1
    # and draws more of a step's rows from the buffer; a pretrained one takes the paper's share
    assert small_config().replay.p_replay == (0.75, 0.5)
    assert small_config(model="some/pretrained-model").replay.p_replay == (0.5, 0.25)
    assert small_config(**{"replay.p_replay": (0.5, 0.25)}).replay.p_replay == (0.5, 0.25)
    with pytest.raises(ConfigError, match=r"optim\.log_z_lr"):
        small_config(**{"optim.log_z_lr": -0.1})


def test_the_embedded_model_trains_on_one_thread_unless_told(tmp_path, monkeypatch):
    # one torch thread by default for the tiny model (two jobs sharing cores do not
    # oversubscribe them); torch's choice for any other model; --threads always wins
    assert build_config().threads == 1
    assert build_config(overrides={"model": "some/pretrained-model"}).threads is None
    assert build_config(overrides={"threads": 2}).threads == 2
    assert build_config(overrides={"model": "some/model", "threads": 3}).threads == 3
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    Trainer(build_config(overrides={"optim.batch_size": 4}), tmp_path, progress=False)
    assert chosen == [1]


def _fake_clock(monkeypatch, seconds_per_call: float) -> None:
    """The clock of the trainer and of its time limit advances ``seconds_per_call`` at each
    reading."""
    now = [0.0]

    def clock() -> float:
        now[0] += seconds_per_call
        return now[0]

    for module in ("train", "stop_request"):
        monkeypatch.setattr(f"raptb.app.training.{module}.monotonic", clock)


def test_time_limit_checkpoints_and_resume_continues_exactly(tmp_path, monkeypatch):
    cfg = small_config(steps=4, seed=4, checkpoint_every=100)
    straight = Trainer(cfg, tmp_path / "a", progress=False)
    straight.train()

    # 60 s per clock reading: 60 s after step 1, 120 s (past 1.5 min) after step 2
    _fake_clock(monkeypatch, 60.0)
    limited = Trainer(cfg.model_copy(update={"time_limit": 1.5}), tmp_path / "b", progress=False)
    result = limited.train()
    assert (result.step, result.stop_reason, result.stop_signal) == (2, "time limit", None)
    assert result.interrupted and result.checkpoint is not None
    assert [p.name for p in list_checkpoints(tmp_path / "b")] == ["step-000002"]

    monkeypatch.undo()
    resumed = Trainer(cfg, tmp_path / "b", resume=True, progress=False)
    assert resumed.train().stop_reason is None
    a, b = straight.policy.model.state_dict(), resumed.policy.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = ("seconds",)
    ra = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "a")]
    rb = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "b")]
    assert ra == rb


def test_cli_time_limit_stops_with_exit_0_and_says_why(tmp_path, monkeypatch):
    _fake_clock(monkeypatch, 60.0)  # 1 min limit: 60 s have passed after the first step
    run = tmp_path / "run"
    args = ["train", "--steps", "3", "--batch-size", "4", "--grad-accum", "1", "--no-progress"]
    out = CliRunner().invoke(app, [*args, "--out", str(run), "--time-limit", "1"])
    assert out.exit_code == 0, out.output
    assert "time limit: 1 min passed; checkpointing after step 1" in out.output
    assert "stopped at the time limit (1 min): 1/3 steps" in out.output
    assert f"raptb train --resume --out {run}" in out.output
    assert [p.name for p in list_checkpoints(run)] == ["step-000001"]
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"), "--time-limit", "0"])
    assert bad.exit_code == 2 and "time_limit" in bad.output


def test_a_cpu_run_takes_adamws_fused_update(tmp_path: Path) -> None:
    """On a CPU, one process, AdamW's fused update (one C++ loop over the parameters)."""
    trainer = Trainer(small_config(steps=1), tmp_path, progress=False)
    assert trainer.optimizer.defaults["fused"] and not trainer.optimizer.defaults["foreach"]
