"""GFlowNetTrainer's rewards follow TRL 1.16's semantics for None and NaN, and an infinite reward
stops the run in one line naming the reward function and the row.

The reference is a transcription of TRL 1.16.0's lines (``trl/trainer/grpo_trainer.py``,
``GRPOTrainer._calculate_rewards`` and ``GRPOTrainer._generate_and_score_completions``); it is
compared with the trainer on the same inputs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.models import build_char_tokenizer
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from raptb.integrations.trl.rewards import summed_rewards
from tests.integrations.trl_fixtures import CPU_RUN, fixed_rollout

LAMBDA = 2.0


def trl_rewards(
    outputs: list[list[float | None]], weights: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards [B], unscorable [B]) transcribed from TRL 1.16.0, trl/trainer/grpo_trainer.py.

    ``outputs[i]`` is what reward function i returned for the B completions."""
    device = "cpu"
    rewards_per_func = torch.zeros(len(outputs[0]), len(outputs), device=device)
    for i, output_reward_func in enumerate(outputs):
        # _calculate_rewards: "Convert None values to NaN"
        output_reward_func = [
            reward if reward is not None else torch.nan for reward in output_reward_func
        ]
        rewards_per_func[:, i] = torch.tensor(
            output_reward_func, dtype=torch.float32, device=device
        )
    reward_weights = torch.tensor(weights, dtype=torch.float32)
    # _generate_and_score_completions, multi_objective_aggregation == "sum_then_normalize":
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    # ... "Unscorable completions ... carry no learning signal": advantages = nan_to_num(..., 0)
    return rewards, unscorable_mask


reward_values = st.one_of(
    st.none(), st.just(math.nan), st.floats(-10, 10, allow_nan=False, width=32)
)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda f: st.tuples(
            st.lists(st.lists(reward_values, min_size=5, max_size=5), min_size=f, max_size=f),
            st.lists(st.floats(0.125, 3.0, width=32), min_size=f, max_size=f),
        )
    )
)
def test_summed_rewards_equal_trls_on_none_and_nan(case: tuple[list, list]) -> None:
    outputs, weights = case
    want, unscorable = trl_rewards(outputs, weights)
    per_func = torch.tensor(
        [[math.nan if r is None else r for r in column] for column in outputs]
    ).T.float()
    got = summed_rewards(per_func, torch.tensor(weights))
    assert torch.equal(torch.isnan(got), unscorable)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)


# --- the trainer on a fixed batch ---------------------------------------------------------------

SCORES: dict[str, tuple[float | None, float | None]] = {
    # completion text -> (first function, second function)
    "aa": (0.5, None),  # one function scores it: S = 0.5
    "b": (None, None),  # unscorable (None)
    "ab": (math.nan, None),  # unscorable (NaN and None)
    "c": (0.25, 0.5),  # S = 0.25 + 2 * 0.5 (weights 1, 2)
    "cc": (None, -0.5),  # S = -1
    "": (math.nan, math.nan),  # unscorable (NaN)
}


def first_reward(completions: list[str], **kwargs: Any) -> list[float | None]:
    return [SCORES[c][0] for c in completions]


def second_reward(completions: list[str], **kwargs: Any) -> list[float | None]:
    return [SCORES[c][1] for c in completions]


def inf_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [math.inf if c == "cc" else 0.0 for c in completions]


def completions() -> dict[str, list[list[int]]]:
    tokenizer = build_char_tokenizer()
    ids = {c: tokenizer.convert_tokens_to_ids(c) for c in "abc"}
    eos = tokenizer.eos_token_id
    rows = [[*(ids[ch] for ch in text), eos] for text in SCORES]
    return {"p": rows[:3], "q": rows[3:]}


def trainer_for(model_dir: Path, out: Path, reward_funcs: list, **overrides: Any):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    values: dict[str, Any] = {
        **CPU_RUN,
        "output_dir": str(out),
        "per_device_train_batch_size": 6,
        "num_generations": 3,
        "loss": "tb",
        "reward_scale": LAMBDA,
        "reward_weights": [1.0, 2.0][: len(reward_funcs)],
        "replay": "rp",
        "rp_tolerance": 0.0,
    }
    values.update(overrides)
    return GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=reward_funcs,
        args=GFlowNetConfig(**values),
        train_dataset=Dataset.from_dict({"prompt": ["p", "q"]}),
        rollout_func=fixed_rollout(completions()),
    )


def test_unscorable_completions_are_left_out_of_the_loss_and_the_buffer(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path, [first_reward, second_reward])
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"prompt": "p"}] * 3 + [{"prompt": "q"}] * 3)

    want, unscorable = trl_rewards(
        [[SCORES[t][0] for t in SCORES], [SCORES[t][1] for t in SCORES]], [1.0, 2.0]
    )
    assert batch["gfn_scorable"].tolist() == (~unscorable).tolist()
    tau = batch["gfn_length"]
    terminal = batch["gfn_u"].gather(1, tau[:, None])[:, 0]
    scorable = ~unscorable
    torch.testing.assert_close(terminal[scorable], LAMBDA * want[scorable])
    # only the scorable completions were stored, with TRL's sum as their score
    assert trainer.buffer is not None
    stored = {it.text: it.score for p in trainer.buffer.prompts() for it in trainer.buffer.items(p)}
    assert stored == pytest.approx({"aa": 0.5, "c": 1.25, "cc": -1.0})

    # the loss is the objective on the scorable rows alone
    loss = trainer._compute_loss(trainer.model, batch)
    # (the rows' tensors; gfn_num_kept, 0-d, is the generation batch's count of kept rows)
    kept = {k: v[scorable] if torch.is_tensor(v) and v.ndim else v for k, v in batch.items()}
    alone = trainer._compute_loss(trainer.model, kept)
    assert float(loss) == pytest.approx(float(alone), rel=1e-5)
    # every row unscorable: a zero loss that still reaches logZ's graph
    none = dict(batch, gfn_scorable=torch.zeros_like(batch["gfn_scorable"]))
    zero = trainer._compute_loss(trainer.model, none)
    assert float(zero) == 0.0 and zero.requires_grad


def test_an_infinite_reward_is_one_line_naming_the_function_and_the_row(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = trainer_for(model_dir, tmp_path, [first_reward, inf_reward])
    trainer.model.train()
    with pytest.raises(ValueError) as info:
        trainer._generate_and_score_completions([{"prompt": "p"}] * 3 + [{"prompt": "q"}] * 3)
    message = str(info.value)
    assert "\n" not in message
    assert "reward function 'inf_reward' returned inf for row 4" in message
    assert "prompt 'q'" in message and "completion 'cc'" in message


def test_scorable_rewards_are_unchanged_with_one_function(model_dir: Path, tmp_path: Path) -> None:
    trainer = trainer_for(model_dir, tmp_path, [second_reward], replay="none")
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{"prompt": "p"}] * 3 + [{"prompt": "q"}] * 3)
    assert batch["gfn_scorable"].tolist() == [
        SCORES[t][1] is not None and not math.isnan(SCORES[t][1]) for t in SCORES
    ]
    assert np.isfinite(batch["gfn_u"].numpy()).all()


def test_prefix_reward_func_gets_the_keyword_arguments_reward_functions_get(
    model_dir: Path, tmp_path: Path
) -> None:
    seen: dict[str, dict[str, Any]] = {}

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        seen["reward"] = kwargs
        return [0.5] * len(completions)

    def prefix(completions: list[str], **kwargs: Any) -> list[float]:
        seen["prefix"] = {"completions": completions, **kwargs}
        kwargs["log_metric"]("prefix_calls", 1.0)
        kwargs["log_extra"]("length", [len(c) for c in completions])
        return [0.1] * len(completions)

    trainer = trainer_for(model_dir, tmp_path, [reward], replay="none")
    trainer.prefix_reward_func = prefix
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{"prompt": "p"}] * 3 + [{"prompt": "q"}] * 3)
    reward_keys = set(seen["reward"]) - {"prompts"}
    assert reward_keys == {"completion_ids", "trainer_state", "log_extra", "log_metric"}
    got = seen["prefix"]
    assert reward_keys <= set(got)
    assert got["trainer_state"] is trainer.state
    texts = got["completions"]
    assert [trainer._tokenizer.decode(ids) for ids in got["completion_ids"]] == texts
    assert trainer._metrics["train"]["prefix_calls"] == [1.0]  # reported with this batch
    # one list per row of its prefixes' values (k = 0..tau-1)
    tau = batch["gfn_length"].tolist()
    assert list(trainer._logs["extra"]["prefix length"]) == [list(range(n)) for n in tau]
