"""GFlowNetTrainer's loss on a fixed batch equals raptb's objective on log-probabilities from a
plain forward of the same model, loss and gradients, for every objective.

The batch goes through TRL's own pipeline (``_generate_and_score_completions`` with a fixed
``rollout_func``, TRL's reward call, left padding of prompts of two lengths): a completion that
stops with EOS after 3 tokens, one that is only EOS (tau = 0), one cut at max_completion_length
without EOS (tau = 6, forced stop) and one of 1 token. The reference below tokenises each row
alone (no padding), runs ``model(ids).logits`` once per row, reads the log-softmax by hand, scores
rewards by calling the reward functions on the decoded texts and builds the prefix batch itself.
"""

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
from transformers import LlamaForCausalLM

from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import objective_by_name
from raptb.core.schedules import LinearSchedule
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from tests.integrations.trl_fixtures import (
    MAX_COMPLETION,
    a_count_reward,
    b_prefix_reward,
    fixed_rollout,
    write_tiny_llama,
)

KAPPA, LAMBDA, T_R, LOG_Z = 0.5, 3.0, 2.0, 0.3
PROMPTS = ["ab", "xyz1"]

# config fields -> the core objective built independently with the same values
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tb": ({}, {}),
    "subtb": (
        {"subtb_lambda": 0.8, "subtb_normalization": "batch"},
        {"subtb_lambda": 0.8, "normalization": "batch"},
    ),
    "raptb": (
        {"eta": 0.5, "gamma": 0.9, "alpha": 0.6, "soft_beta": 2.0, "rho": 0.3, "subtb_lambda": 0.9},
        {
            "eta": 0.5,
            "gamma": 0.9,
            "alpha": 0.6,
            "beta": 2.0,
            "rho": 0.3,
            "subtb_lambda": 0.9,
            "k_min": LinearSchedule(1, 1, 0, integer=True),
        },
    ),
    "avg_prefix_tb": ({}, {}),
    "root_subtb_logz": ({"subtb_lambda": 0.7}, {"subtb_lambda": 0.7}),
    "vargrad": ({}, {}),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tokenizer = write_tiny_llama(folder)
    eos = tokenizer.eos_token_id
    ids = {c: tokenizer.convert_tokens_to_ids(c) for c in "abc"}
    a, b, c = ids["a"], ids["b"], ids["c"]
    completions = {
        "ab": [[a, a, b, eos], [eos]],
        "xyz1": [[c, a, b, a, c, a], [b, eos]],
    }
    assert len(completions["xyz1"][0]) == MAX_COMPLETION
    return {"folder": folder, "tokenizer": tokenizer, "completions": completions}


def make_trainer(setup: dict[str, Any], loss: str, fields: dict[str, Any], out: Path):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = GFlowNetConfig(
        output_dir=str(out),
        report_to=[],
        bf16=False,
        use_cpu=True,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=MAX_COMPLETION,
        gradient_checkpointing=False,
        loss=loss,
        kappa=KAPPA,
        reward_scale=LAMBDA,
        reward_temperature=T_R,
        log_z_init=LOG_Z,
        **fields,
    )
    return GFlowNetTrainer(
        model=str(setup["folder"]),
        reward_funcs=a_count_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        prefix_reward_func=b_prefix_reward,
        rollout_func=fixed_rollout(setup["completions"]),
    )


def independent_batch(setup: dict[str, Any], policy: torch.nn.Module) -> PrefixBatch:
    """The prefix batch of the fixed rows, from one unpadded forward per row."""
    tokenizer = setup["tokenizer"]
    eos = tokenizer.eos_token_id
    reference = LlamaForCausalLM.from_pretrained(setup["folder"]).eval()
    rows = [(p, comp) for p in PROMPTS for comp in setup["completions"][p]]
    big_t = MAX_COMPLETION
    log_pf = torch.zeros(len(rows), big_t)
    log_pterm = torch.zeros(len(rows), big_t + 1)
    log_r = torch.zeros(len(rows), big_t + 1)
    u = torch.zeros(len(rows), big_t + 1)
    length = torch.zeros(len(rows), dtype=torch.long)
    for r, (prompt, comp) in enumerate(rows):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        tau = len(comp) - 1 if comp[-1] == eos else len(comp)
        length[r] = tau
        ids = torch.tensor([prompt_ids + comp])
        lp = policy(input_ids=ids).logits[0].float().log_softmax(-1)
        with torch.no_grad():
            ref_lp = reference(input_ids=ids).logits[0].float().log_softmax(-1)
        start = len(prompt_ids) - 1
        ref_cum = 0.0
        for k in range(tau + 1):
            text = tokenizer.decode(comp[:k])
            score = a_count_reward([text])[0] if k == tau else b_prefix_reward([text])[0]
            u[r, k] = LAMBDA * score / T_R
            log_pterm[r, k] = lp[start + k, eos]
            log_r[r, k] = KAPPA * (ref_cum + ref_lp[start + k, eos]) / T_R + u[r, k]
            if k < tau:
                log_pf[r, k] = lp[start + k, comp[k]]
                ref_cum = ref_cum + ref_lp[start + k, comp[k]]
    return PrefixBatch(log_pf, log_pterm, log_r, u, length)


def gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


@pytest.mark.parametrize("loss", list(CASES))
def test_trainer_loss_and_gradients_equal_the_objective_on_a_plain_forward(
    setup: dict[str, Any], loss: str, tmp_path: Path
) -> None:
    fields, core = CASES[loss]
    trainer = make_trainer(setup, loss, fields, tmp_path)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # as the training loop sets it
    batch = trainer._generate_and_score_completions(
        [{"prompt": p} for p in PROMPTS for _ in (0, 1)]
    )
    assert batch["gfn_length"].tolist() == [3, 0, 6, 1]

    params = [p for p in trainer.model.parameters() if p.requires_grad] + [trainer.log_z]
    got = trainer._compute_loss(trainer.model, batch)
    got.backward()
    got_grads = gradients(params)
    for p in params:
        p.grad = None

    expected, _ = objective_by_name(loss, **core)(
        independent_batch(setup, trainer.model), trainer.log_z, 0
    )
    expected.backward()
    want_grads = gradients(params)

    assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-6)
    assert float(expected.detach()) > 1e-3  # a loss that is not trivially zero
    largest = max(float(g.abs().max()) for g in want_grads)
    assert largest > 1e-3
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6 * largest)
    if loss in ("subtb", "vargrad"):
        assert float(want_grads[-1]) == 0.0  # logZ cancels or is estimated
    else:
        assert float(want_grads[-1].abs()) > 0.0  # the gradient reaches logZ
