"""logZ travels with a saved model: ``trainer.save_model(folder)`` writes it beside the weights,
and a GFlowNetTrainer built on that folder starts there (not at ``log_z_init``). Saved after N
steps, reloaded and trained N more, the run equals one of 2N steps uninterrupted: losses, logZ and
weights (plain SGD at a constant learning rate and the same rows every step, so that nothing but
the weights and logZ carries a run's state; with Adam, a checkpoint carries the rest:
tests/integrations/test_trl_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from raptb.adapters.lm.models import build_char_tokenizer
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from raptb.integrations.trl.checkpoint_state import LOG_Z_FILE, saved_log_z
from tests.integrations.trl_fixtures import CPU_RUN, fixed_rollout, scorable_lowercase

N = 2  # steps before the save, and after the reload
LOG_Z_INIT = 30.0
# one completion per prompt (every step trains the same 16 rows): scorable, None and NaN ones
TEXTS = {"p0": "abcab", "p1": "aXb", "p2": "7ab", "p3": "!ba"}


def trainer_on(model: Any, out: Path, steps: int, **fields: Any) -> GFlowNetTrainer:
    tokenizer = build_char_tokenizer()
    eos = tokenizer.eos_token_id
    completions = {
        p: [[*tokenizer.encode(t, add_special_tokens=False), eos]] for p, t in TEXTS.items()
    }
    args = GFlowNetConfig(
        **CPU_RUN,
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=16,
        num_generations=4,
        optim="sgd",
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        loss="raptb",
        replay="none",
        kappa=0.0,  # TRL's reference is a run's initial weights: the reloaded run's would differ
        reward_scale=10.0,
        log_z_init=LOG_Z_INIT,
        log_z_lr=0.05,
        seed=7,
        **fields,
    )
    return GFlowNetTrainer(
        model=model,
        reward_funcs=scorable_lowercase,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(TEXTS)}),
        rollout_func=fixed_rollout(completions),
    )


def trained(trainer: GFlowNetTrainer) -> dict[str, Any]:
    trainer.train()
    return {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "log_z": trainer.log_z.item(),
        "weights": {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
    }


def test_a_saved_model_reloaded_continues_as_the_uninterrupted_run(
    model_dir: Path, tmp_path: Path
) -> None:
    straight = trained(trainer_on(str(model_dir), tmp_path / "straight", 2 * N))
    first = trainer_on(str(model_dir), tmp_path / "first", N)
    trained(first)
    folder = tmp_path / "saved"
    first.save_model(str(folder))
    saved = first.log_z.item()
    assert saved != pytest.approx(LOG_Z_INIT, abs=0.1)  # logZ has moved
    assert json.loads((folder / LOG_Z_FILE).read_text())["log_z"] == saved

    again = trainer_on(str(folder), tmp_path / "again", N)
    assert again.log_z.item() == saved
    assert again.log_z.dtype == torch.float32
    resumed = trained(again)
    np.testing.assert_allclose(resumed["losses"], straight["losses"][N:], rtol=1e-5)
    assert resumed["log_z"] == pytest.approx(straight["log_z"], abs=1e-5)
    for name, weight in straight["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], weight, rtol=1e-5, atol=1e-6)

    # a model instance loaded from the folder carries it too; log_z_from_model=False does not
    instance = AutoModelForCausalLM.from_pretrained(folder)
    assert trainer_on(instance, tmp_path / "inst", N).log_z.item() == saved
    kept = trainer_on(str(folder), tmp_path / "init", N, log_z_from_model=False)
    assert kept.log_z.item() == LOG_Z_INIT


@pytest.mark.parametrize("text", ['{"log_z": "x"}', "{}", '{"log_z": NaN}', "not json"])
def test_a_saved_log_z_that_is_not_a_finite_number_is_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / LOG_Z_FILE).write_text(text)
    with pytest.raises(ValueError, match="log_z_from_model=False") as caught:
        saved_log_z(str(tmp_path))
    assert "\n" not in str(caught.value)
    assert str(tmp_path / LOG_Z_FILE) in str(caught.value)


def test_a_folder_without_a_saved_log_z_gives_none(tmp_path: Path) -> None:
    assert saved_log_z(str(tmp_path)) is None
    assert saved_log_z(None) is None
