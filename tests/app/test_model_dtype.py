"""``model_dtype`` through a run: a training step of a small random Llama with bfloat16 base
weights updates its float32 LoRA adapters (AdamW's moments float32) and float32 logZ, leaves the
base weights as they were; config.toml records the dtype that ran ("auto" resolved) and the
checkpoint reloads in it; the embedded model refuses bfloat16 in one line, exit 2."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from raptb.adapters.lm import precision
from raptb.app.cli import app
from raptb.app.configuration.config import build_config
from raptb.app.evaluation.eval_run import checkpoint_policy
from raptb.app.run_dir.checkpoint import latest_checkpoint
from raptb.app.run_dir.run_config import load_config
from raptb.app.training.train import Trainer
from tests.adapters.test_lora import TOKENIZER, _tiny_llama
from tests.app.test_study_plan import STUDIES, plan

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama (2 layers, width 32) with the character tokenizer, saved in float32."""
    folder = tmp_path_factory.mktemp("llama")
    _tiny_llama().save_pretrained(folder)
    TOKENIZER.save_pretrained(folder)
    return folder


def _trainer(llama_dir: Path, run: Path, dtype: str) -> Trainer:
    overrides = {
        "model": str(llama_dir),
        "model_dtype": dtype,
        "loss": "tb",  # one that trains logZ (RapTB's root cancels it)
        "lora.rank": 4,
        "steps": 1,
        "threads": 1,
        "optim.batch_size": 4,
        "optim.grad_accum": 1,
        "optim.lr": 1e-2,
        "optim.log_z_lr": 0.1,
        "replay.kind": "none",
        "reward.kappa": 0.0,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trainer(build_config(overrides=overrides), run, progress=False)


def test_a_bfloat16_step_trains_float32_adapters_and_reloads(
    llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)  # any CPU (emulated or native)
    run = tmp_path / "run"
    trainer = _trainer(llama_dir, run, "bfloat16")
    model = trainer.policy.model
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert {p.dtype for p in base.values()} == {torch.bfloat16}
    assert lora and {p.dtype for p in lora.values()} == {torch.float32}
    trainer.train()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in base.items())
    assert any(not torch.equal(after[n], p) for n, p in lora.items())
    assert {after[n].dtype for n in lora} == {torch.float32}
    log_z = trainer.algorithm.log_z
    assert log_z.dtype == torch.float32 and float(log_z.detach()) != 0.0
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    recorded = tomllib.loads((run / "config.toml").read_text())
    assert recorded["model_dtype"] == "bfloat16"
    config = load_config(run / "config.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy = checkpoint_policy(config, latest_checkpoint(run), trainer.task)
    reloaded = dict(policy.model.named_parameters())
    assert {reloaded[n].dtype for n in base} == {torch.bfloat16}
    assert all(torch.equal(reloaded[n], after[n]) for n in lora)


def test_auto_records_float32_on_the_cpu(llama_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(llama_dir, tmp_path / "run", "auto")
    assert {p.dtype for p in trainer.policy.model.parameters()} == {torch.float32}
    assert trainer.cfg.model_dtype == "float32"


def test_the_embedded_model_refuses_bfloat16(tmp_path: Path) -> None:
    args = ["train", "--model_dtype", "bfloat16", "--out", str(tmp_path / "run"), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: model_dtype: 'bfloat16' is for a pretrained model; the embedded 'tiny' model's "
        "compiled CPU kernels are float32: drop --model_dtype (or set 'float32')"
    ]


def test_the_bfloat16_study_is_the_float32_row_but_its_dtype() -> None:
    """studies/pretrained_smiles_bf16.toml: pretrained_smiles.toml's RapTB + SubM runs, seed by
    seed, with model_dtype = "bfloat16" the only difference."""
    runs = plan(STUDIES / "pretrained_smiles_bf16.toml")
    want = {
        r.seed: r.config
        for r in plan(STUDIES / "pretrained_smiles.toml")
        if r.row == "RapTB + SubM"
    }
    assert sorted(r.seed for r in runs) == sorted(want) == [0, 1]
    for run in runs:
        assert run.config.model_dtype == "bfloat16"
        assert run.config.model_copy(update={"model_dtype": "auto"}) == want[run.seed]
