"""Replay in GFlowNetTrainer on TRL's usual single pass (many prompts, each seen once): with the
default ``replay_scope="across_prompts"`` replayed rows come from other prompts and train under
their own prompt; ``"per_prompt"`` never fires there, and says so at construction."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
from datasets import Dataset

from raptb.adapters.lm.models import build_char_tokenizer
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from tests.integrations.trl_fixtures import (
    CPU_RUN,
    a_count_reward,
    abc_eos,
    fixed_rollout,
)

PROMPTS = [f"p{i:02d}" + "x" * (i % 3) for i in range(12)]  # prompts of three lengths


def single_pass(out: Path, **overrides: Any) -> GFlowNetConfig:
    """12 prompts, 3 per step (6 rows, 2 generations each) over 4 steps: each seen once."""
    values: dict[str, Any] = {
        **CPU_RUN,
        "output_dir": str(out),
        "per_device_train_batch_size": 6,
        "num_generations": 2,
        "max_steps": 4,
        "learning_rate": 1e-3,
        "replay": "rp",
        "kappa": 1.0,
    }
    values.update(overrides)
    return GFlowNetConfig(**values)


def trainer_for(model_dir: Path, args: GFlowNetConfig, **kwargs: Any) -> GFlowNetTrainer:
    return GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=a_count_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        **kwargs,
    )


def replayed_fractions(trainer: GFlowNetTrainer) -> list[float]:
    return [
        h["gflownet/replayed_fraction"]
        for h in trainer.state.log_history
        if "gflownet/replayed_fraction" in h
    ]


def test_a_single_pass_recipe_replays_by_default(model_dir: Path, tmp_path: Path) -> None:
    trainer = trainer_for(model_dir, single_pass(tmp_path))
    assert trainer.gfn_args.replay_scope == "across_prompts"
    seen: list[str] = []
    original = trainer._generate_and_score_completions

    def spy(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        seen.extend(x["prompt"] for x in inputs)
        return original(inputs)

    trainer._generate_and_score_completions = spy  # type: ignore[method-assign]
    trainer.train()
    assert sorted(set(seen)) == sorted(PROMPTS) and len(seen) == 2 * len(PROMPTS)  # one pass
    fractions = replayed_fractions(trainer)
    assert len(fractions) == 4 and fractions[0] == 0.0
    assert min(fractions[1:]) > 0.0, fractions  # from the second generation batch on


def test_per_prompt_replay_on_a_single_pass_warns_and_never_fires(
    model_dir: Path, tmp_path: Path
) -> None:
    with pytest.warns(UserWarning, match="never replays: replay_scope='per_prompt'"):
        trainer = trainer_for(model_dir, single_pass(tmp_path, replay_scope="per_prompt"))
    trainer.train()
    assert replayed_fractions(trainer) == [0.0] * 4


def test_a_zero_replay_fraction_warns(model_dir: Path, tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="replay_fraction is 0 throughout"):
        trainer_for(model_dir, single_pass(tmp_path, replay_fraction=0.0, replay_fraction_end=0.0))


def test_a_revisited_dataset_does_not_warn_per_prompt(model_dir: Path, tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer_for(model_dir, single_pass(tmp_path, replay_scope="per_prompt", max_steps=5))


def test_a_row_replayed_from_another_prompt_is_trained_under_that_prompt(
    model_dir: Path, tmp_path: Path
) -> None:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tokenizer = build_char_tokenizer()
    a, b, c, eos = abc_eos()
    completions = {
        "ab": [[a, a, eos], [b, a, eos]],
        "long prompt": [[a, b, a, b, a, b], [eos]],
        "cd": [[c, eos], [c, c, eos]],
        "q": [[c, c, c, eos], [b, eos]],
    }
    trainer = trainer_for(
        model_dir,
        single_pass(tmp_path, replay_fraction=1.0, replay_fraction_end=1.0),
        rollout_func=fixed_rollout(completions),
    )
    trainer.model.train()
    trainer._generate_and_score_completions(
        [{"prompt": p} for p in ("ab", "ab")] * 1
        + [{"prompt": p} for p in ("long prompt", "long prompt")]
    )
    assert trainer.buffer is not None and set(trainer.buffer.prompts()) == {"ab", "long prompt"}
    stored = {it.tokens: it for p in trainer.buffer.prompts() for it in trainer.buffer.items(p)}
    second = trainer._generate_and_score_completions(
        [{"prompt": p} for p in ("cd", "cd", "q", "q")]
    )
    lengths = second["gfn_length"].tolist()
    prompts_seen = set()
    for row in range(4):
        tokens = tuple(second["completion_ids"][row, : lengths[row]].tolist())
        item = stored[tokens]  # every row was replaced (fraction 1), none by its own prompt
        prompt = second["prompt_ids"][row][second["prompt_mask"][row].bool()].tolist()
        assert tokenizer.decode(prompt) == item.prompt
        prompts_seen.add(item.prompt)
        width = item.length + 1
        np.testing.assert_allclose(second["gfn_u"][row, :width].numpy(), item.u, rtol=1e-6)
        # the reference term is recomputed under the item's prompt: it matches the stored one
        np.testing.assert_allclose(
            second["gfn_log_r"][row, :width].numpy(), item.log_r, rtol=1e-5, atol=1e-5
        )
    assert prompts_seen <= {"ab", "long prompt"}
    # prompts of two lengths, left-padded: the last prompt column is a prompt token in every row
    assert bool(second["prompt_mask"][:, -1].all())
