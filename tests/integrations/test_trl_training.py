"""GFlowNetTrainer end to end on the CPU: a short run learns (logZ and the reward move), a TRL
checkpoint restores logZ, the replay buffer and the replay sampler, and replayed rows carry their
stored items (tokens and task rewards)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import numpy as np
import torch
from datasets import Dataset

from raptb.core.replay import ReplayBuffer
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from tests.integrations.trl_fixtures import (
    CPU_RUN,
    MAX_COMPLETION,
    a_count_reward,
    abc_eos,
    batch_rows,
    fixed_rollout,
)

LOG_Z_INIT = 30.0  # about log(V^6 E[R]) for this model: the policy's signal is not swamped


def lowercase_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Toy task score in [0, 1]: the share of lowercase letters in six characters."""
    return [sum(ch.islower() for ch in c) / MAX_COMPLETION for c in completions]


def config(out: Path, **overrides: Any) -> GFlowNetConfig:
    values: dict[str, Any] = {
        **CPU_RUN,
        "output_dir": str(out),
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "learning_rate": 3e-2,
        "lr_scheduler_type": "constant",
        "loss": "raptb",
        "replay": "subm",
        "reward_scale": 10.0,
        "log_z_init": LOG_Z_INIT,
        "log_z_lr": 0.5,
    }
    values.update(overrides)
    return GFlowNetConfig(**values)


def trainer_for(model_dir: Path, args: GFlowNetConfig, **kwargs: Any) -> GFlowNetTrainer:
    return GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=kwargs.pop("reward_funcs", lowercase_reward),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"]}),
        **kwargs,
    )


def stored(buffer: ReplayBuffer) -> list[tuple[str, tuple[int, ...], tuple[float, ...], float]]:
    return [
        (it.prompt, it.tokens, tuple(it.u.tolist()), it.terminal_log_r)
        for p in buffer.prompts()
        for it in buffer.items(p)
    ]


def test_a_short_cpu_run_moves_log_z_and_the_reward(model_dir: Path, tmp_path: Path) -> None:
    trainer = trainer_for(model_dir, config(tmp_path, max_steps=14))
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 14
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.1, rewards
    assert abs(trainer.log_z.item() - LOG_Z_INIT) > 1.0
    logged = [h["gflownet/log_z"] for h in trainer.state.log_history if "gflownet/log_z" in h]
    assert logged[0] == pytest.approx(LOG_Z_INIT) and logged[-1] != logged[0]
    assert trainer.buffer is not None and len(trainer.buffer) > 0
    replayed = [h["gflownet/replayed_fraction"] for h in trainer.state.log_history[1:-1]]
    assert max(replayed) > 0  # buffer items took part from the second step on


def test_resume_from_a_trl_checkpoint_restores_log_z_and_the_buffer(
    model_dir: Path, tmp_path: Path
) -> None:
    first = trainer_for(
        model_dir, config(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    )
    first.train()
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "gflownet_state_0.pt").exists()
    assert first.buffer is not None and len(first.buffer) > 0

    second = trainer_for(model_dir, config(tmp_path, max_steps=2))
    assert second.log_z.item() == LOG_Z_INIT and second.buffer is not None
    assert len(second.buffer) == 0
    second.train(resume_from_checkpoint=str(checkpoint))
    assert second.log_z.item() == first.log_z.item() != LOG_Z_INIT
    assert stored(second.buffer) == stored(first.buffer)
    assert second.replay_rng.bit_generator.state == first.replay_rng.bit_generator.state
    group = second.optimizer.param_groups[-1]
    assert group["params"][0] is second.log_z and group["lr"] == pytest.approx(0.5)


def test_replayed_rows_carry_their_stored_tokens_and_task_rewards(
    model_dir: Path, tmp_path: Path
) -> None:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    a, b, c, eos = abc_eos()
    # the second generation batch is new text, so any first-batch tokens in it were replayed
    completions = {
        "ab": [[a, a, eos], [b, eos], [c, c, eos], [c, eos]],
        "cd": [[a, b, a, b, a, b], [eos], [c, eos], [c, c, c, eos]],
    }
    calls: list[int] = []

    def similarity(x: list[str], y: list[str]) -> np.ndarray:
        calls.append(len(x) * len(y))
        return np.array([[float(s == t) for t in y] for s in x])

    trainer = trainer_for(
        model_dir,
        config(
            tmp_path,
            replay_fraction=1.0,
            replay_fraction_end=1.0,
            kappa=1.0,
            replay_scope="per_prompt",
        ),
        reward_funcs=a_count_reward,
        rollout_func=fixed_rollout(completions),
        replay_similarity=similarity,
    )
    trainer.model.train()
    inputs = [{"prompt": p} for p in ("ab", "ab", "cd", "cd")]
    first = trainer._generate_and_score_completions(inputs)
    assert calls and trainer.buffer is not None
    items = {
        (it.prompt, it.tokens): it
        for p in trainer.buffer.prompts()
        for it in trainer.buffer.items(p)
    }
    assert {tokens for _, tokens in items} == {(a, a), (b,), (a, b, a, b, a, b), ()}

    second = trainer._generate_and_score_completions(inputs)
    lengths = second["gfn_length"].tolist()
    for row, prompt in enumerate(("ab", "ab", "cd", "cd")):
        tokens = tuple(second["completion_ids"][row, : lengths[row]].tolist())
        key = next(k for k in items if k[1] == tokens)
        item = items[key]
        assert key[0].endswith(prompt)  # drawn from this row's own prompt
        width = item.length + 1
        np.testing.assert_allclose(second["gfn_u"][row, :width].numpy(), item.u, rtol=1e-6)
        # the reference prior is recomputed, so log_r matches the stored one (same weights)
        np.testing.assert_allclose(
            second["gfn_log_r"][row, :width].numpy(), item.log_r, rtol=1e-5, atol=1e-5
        )
        stop = second["completion_ids"][row, lengths[row]].item() if lengths[row] < 6 else None
        assert stop in (eos, None)
    assert first["gfn_length"].tolist() == [2, 1, 6, 0]


def test_with_peft_the_reference_is_the_base_model_with_the_adapter_disabled(
    model_dir: Path, tmp_path: Path
) -> None:
    from peft import LoraConfig
    from transformers import LlamaForCausalLM

    from raptb.integrations.trl.prefix_log_probs import prefix_log_probs, stop_log_prob

    trainer = trainer_for(
        model_dir,
        config(tmp_path, max_steps=2, kappa=1.0, replay="rp", learning_rate=1e-2),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    assert trainer.ref_model is None  # TRL keeps no copy: the adapter is switched off instead
    trainer.train()
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{"prompt": "ab"}] * 8)
    rows = batch_rows(batch)
    base = LlamaForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        want = stop_log_prob(*prefix_log_probs(base, *rows, trainer.stop_ids), rows[-1])
        policy = stop_log_prob(*prefix_log_probs(trainer.model, *rows, trainer.stop_ids), rows[-1])
    assert float((policy - want).abs().max()) > 1e-3  # the adapter was trained
    np.testing.assert_allclose(batch["gfn_log_r"], batch["gfn_u"] + want, rtol=1e-5, atol=1e-5)
