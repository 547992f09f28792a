"""What TRL writes about a GFlowNetTrainer run: the model card names the GFlowNet method and cites
the paper raptb implements (not GRPO's DeepSeekMath), and the completions table shows the rows the
loss trained on (replayed rows marked, with their stored text) and log R / log pi instead of GRPO's
advantage."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
import pandas as pd
import torch
from datasets import Dataset

from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from raptb.integrations.trl.prefix_log_probs import prefix_log_probs, stop_log_prob
from tests.integrations.trl_fixtures import (
    CPU_RUN,
    a_count_reward,
    abc_eos,
    batch_rows,
    fixed_rollout,
)

LAMBDA = 3.0
FOUR_ROWS = [{"prompt": "ab"}] * 2 + [{"prompt": "cd"}] * 2


def trainer_for(model_dir: Path, out: Path, **overrides: Any) -> GFlowNetTrainer:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    a, b, c, eos = abc_eos()
    # the second batch is new text: a replayed row shows first-batch text
    completions = {
        "ab": [[a, a, eos], [b, eos], [c, c, eos], [c, eos]],
        "cd": [[a, b, a, eos], [eos], [b, b, eos], [c, c, c, eos]],
    }
    values: dict[str, Any] = {
        **CPU_RUN,
        "output_dir": str(out),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "loss": "raptb",
        "replay": "subm",
        "reward_scale": LAMBDA,
        "replay_fraction": 0.5,
        "replay_fraction_end": 0.5,
        "log_completions": True,
    }
    values.update(overrides)
    return GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=a_count_reward,
        args=GFlowNetConfig(**values),
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"]}),
        rollout_func=fixed_rollout(completions),
    )


def test_the_model_card_names_the_method_and_cites_the_paper(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path, log_completions=False)
    trainer.create_model_card(model_name="run")
    card = (tmp_path / "README.md").read_text()
    assert "DeepSeekMath" not in card and "GRPO" not in card
    assert "RapTB" in card and "submodular replay (SubM)" in card
    title = "Rooted Absorbed Prefix Trajectory Balance with Submodular Replay for GFlowNet Training"
    assert title in card
    assert card.count("@inproceedings{") == 1  # RapTB and SubM share one paper
    assert "@inproceedings{wang2026raptb" in card
    assert "Xi Wang and Wenbo Lu and Shengjie Wang" in card


@pytest.mark.parametrize(
    ("loss", "replay", "cited", "linked"),
    [
        ("tb", "rp", ["malkin2022trajectory", "hu2024amortizing"], "2201.13259"),
        ("vargrad", "none", ["richter2020vargrad"], "2010.10436"),
        ("subtb", "prt", ["madan2023learning", "shen2023towards"], "2209.12782"),
        ("tb", "subm", ["malkin2022trajectory", "wang2026raptb"], "2201.13259"),
    ],
)
def test_the_model_card_cites_each_losss_and_buffers_own_paper(
    model_dir: Path, tmp_path: Path, loss: str, replay: str, cited: list[str], linked: str
) -> None:
    trainer = trainer_for(model_dir, tmp_path, log_completions=False, loss=loss, replay=replay)
    trainer.create_model_card(model_name="run")
    card = (tmp_path / "README.md").read_text()
    keys = re.findall(r"@inproceedings\{(\w+),", card)
    assert keys == cited
    assert f"https://huggingface.co/papers/{linked}" in card
    if "wang2026raptb" not in cited:
        assert "Rooted Absorbed" not in card and "RapTB" not in card


def test_the_completions_table_shows_the_trained_rows_and_gflownet_quantities(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path)
    trainer.train()
    first = pd.read_parquet(tmp_path / "completions" / "completions_00001.parquet")
    table = pd.read_parquet(tmp_path / "completions" / "completions_00002.parquet")
    assert "advantage" not in table.columns
    assert {"replayed", "reward", "log_R", "log_pi", "a_count_reward"} <= set(table.columns)
    assert not first["replayed"].any() and table["replayed"].sum() == 2  # half of 4 rows
    replayed = table[table["replayed"]]
    generated_second = {"cc", "", "bb", "ccc"}
    # a replayed row shows the stored first-batch completion it trained on, not the discarded one
    assert set(replayed["completion"]) <= set(first["completion"])
    assert not set(replayed["completion"]) & generated_second
    assert replayed["a_count_reward"].isna().all()  # not scored this step
    fresh = table[~table["replayed"]]
    np.testing.assert_allclose(fresh["reward"], fresh["a_count_reward"])
    # kappa = 0: log R at the stop is lambda * S, for generated and replayed rows alike
    np.testing.assert_allclose(table["log_R"], LAMBDA * table["reward"], rtol=1e-6)
    assert (table["log_pi"] < 0).all()


def test_log_pi_is_the_policys_log_probability_of_the_completion_and_its_stop(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(FOUR_ROWS)
    rows = batch_rows(batch)
    with torch.no_grad():
        want = stop_log_prob(*prefix_log_probs(trainer.model, *rows, trainer.stop_ids), rows[-1])
    tau = batch["gfn_length"][:, None]
    np.testing.assert_allclose(
        list(trainer._logs["gflownet"]["log_pi"]), want.gather(1, tau)[:, 0], rtol=1e-5
    )


@pytest.mark.parametrize("loss", ["subtb", "vargrad", "tb"])
def test_the_logs_show_log_z_only_where_the_objective_uses_it(
    model_dir: Path, tmp_path: Path, loss: str
) -> None:
    """SubTB's logZ cancels and VarGrad estimates it from the batch: the idle learned logZ
    (which never moves) is not logged as theirs; VarGrad's estimate is, under its own name."""
    trainer = trainer_for(model_dir, tmp_path, loss=loss, replay="none", log_completions=False)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    for _ in range(2):
        batch = trainer._generate_and_score_completions(FOUR_ROWS)
        trainer._compute_loss(trainer.model, batch)
    logged = trainer._metrics["train"]
    assert ("gflownet/log_z" in logged) == (loss == "tb")
    if loss == "vargrad":
        first, second = logged["gflownet/log_z_estimate"]
        assert first != second  # the estimate follows the batch
        assert first != pytest.approx(trainer.log_z.item())


def test_num_iterations_trains_each_generation_batch_that_many_times(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path, num_iterations=2, log_completions=False)
    calls = {"generate": 0, "loss": 0}
    generate, compute = trainer._generate_and_score_completions, trainer._compute_loss

    def counted_generate(inputs: Any) -> Any:
        calls["generate"] += 1
        return generate(inputs)

    def counted_loss(model: Any, inputs: Any) -> Any:
        calls["loss"] += 1
        return compute(model, inputs)

    trainer._generate_and_score_completions = counted_generate  # type: ignore[method-assign]
    trainer._compute_loss = counted_loss  # type: ignore[method-assign]
    trainer.train()
    assert calls == {"generate": 1, "loss": 2}
    unused = (GFlowNetConfig.__doc__ or "").split("are not used by the GFlowNet loss")[0]
    assert "`num_iterations`" not in unused  # the docstring does not call it unused
