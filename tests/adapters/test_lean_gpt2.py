"""The lean GPT-2 forward against the model's own (transformers') forward, the reference: logits
of left-padded prompts with and without past columns, teacher-forced log-probs and their
parameter gradients through ``HFPolicy.score``, and rollouts, on freshly initialised tiny models
of several seeds (weights scaled up so that the logits are far from uniform)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from raptb.adapters.lm.embedded import lean_gpt2
from raptb.adapters.lm.models import build_char_tokenizer, build_tiny_model
from raptb.adapters.lm.row_prompts import left_padded
from tests.adapters.test_policy import gen, make_policy

PROMPTS = ("", "24:", "Make 24 now:")


def sharpened(seed: int) -> torch.nn.Module:
    """A tiny model whose weights are scaled up (logits far from uniform)."""
    model = build_tiny_model(build_char_tokenizer(), seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def reference_logits(model: torch.nn.Module, ids, mask, positions) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_equals_the_models_own(seed: int) -> None:
    model = sharpened(seed)
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 95, (n,), generator=g).tolist() for n in (1, 4, 9, 4)]
    ids, mask, positions = left_padded(rows, pad_id=96, device=torch.device("cpu"))
    with torch.no_grad():
        want = reference_logits(model, ids, mask, positions)
        got, _ = lean_gpt2.forward(model, ids, positions, key_mask=mask.bool())
    real = mask.bool()  # a pad's own output is arbitrary; every real token's must agree
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 3])
def test_past_columns_equal_one_call(seed: int) -> None:
    model = sharpened(seed)
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 95, (n,), generator=g).tolist() for n in (2, 6, 5)]
    ids, mask, positions = left_padded(rows, pad_id=96, device=torch.device("cpu"))
    with torch.no_grad():
        whole, _ = lean_gpt2.forward(model, ids, positions, key_mask=mask.bool())
        first, past = lean_gpt2.forward(
            model, ids[:, :3], positions[:, :3], None, mask[:, :3].bool()
        )
        middle, past = lean_gpt2.forward(
            model, ids[:, 3:5], positions[:, 3:5], past, mask[:, :5].bool()
        )
        last, _ = lean_gpt2.forward(model, ids[:, 5:], positions[:, 5:], past, mask.bool())
    pieces = torch.cat([first, middle, last], dim=1)
    real = mask.bool()
    torch.testing.assert_close(pieces[real], whole[real], atol=1e-5, rtol=1e-5)


def test_a_shared_prompt_is_computed_once_and_broadcast() -> None:
    model = sharpened(4)
    prompt = [95, 20, 21, 26]
    logits, past, following, key_mask = lean_gpt2.prompt_logits_and_past(
        model, [prompt] * 5, pad_id=96, device=torch.device("cpu")
    )
    assert key_mask is None and past[0][0].shape[0] == 1
    assert logits.shape == (5, 98) and following.tolist() == [[4]] * 5
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(logits, want.expand(5, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("seed", "prompt"), [(5, [95]), (6, [95, 20, 21, 26, 30])])
def test_shared_prompt_logits_equal_the_models_own(seed: int, prompt: list[int]) -> None:
    """One pass over the prompt and every row's tokens: each row's logits [T + 1, V] (after the
    prompt, then after each token) and every parameter's gradient of a weighted sum of them,
    against the model's own forward of the row alone (prompt + tokens)."""
    model = sharpened(seed)
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(0, 95, (4, 6), generator=g)
    weights = torch.randn(4, 7, 98, generator=g)
    results = []
    for lean in (True, False):
        model.zero_grad()
        if lean:
            logits = lean_gpt2.shared_prompt_logits(model, prompt, body)
        else:
            rows = torch.cat([torch.tensor(prompt).expand(4, -1), body], dim=1)
            logits = model(input_ids=rows).logits[:, len(prompt) - 1 :]
        (logits * weights).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (got, grads), (want, grads_ref) = results
    assert got.shape == (4, 7, 98)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for mine, ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(mine, ref, atol=1e-4 * float(ref.abs().max()), rtol=0)


def _model_path(policy, monkeypatch):
    monkeypatch.setattr(policy, "uses_lean_gpt2", lambda model: False)


@pytest.mark.parametrize("prompts", [PROMPTS[1], [PROMPTS[b % 3] for b in range(6)]])
def test_score_and_its_gradients_equal_the_model_path(prompts, monkeypatch) -> None:
    policy = make_policy(seed=5, logit_scale=4.0)
    assert policy.uses_lean_gpt2(policy.model)
    r = policy.sample(prompts, 6, min_length=0, max_length=7, generator=gen(2))
    results = []
    for lean in (True, False):
        if not lean:
            _model_path(policy, monkeypatch)
        policy.model.zero_grad()
        log_pf, log_pterm = policy.score(prompts, r.tokens, r.length)
        (log_pf.sum() + 0.5 * log_pterm.sum()).backward()
        grads = [p.grad.clone() for p in policy.model.parameters()]
        results.append((log_pf.detach(), log_pterm.detach(), grads))
    (pf, pterm, grads), (pf_ref, pterm_ref, grads_ref) = results
    torch.testing.assert_close(pf, pf_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pterm, pterm_ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompts", [PROMPTS[2], [PROMPTS[b % 3] for b in range(9)]])
def test_rollout_equals_the_model_path(prompts, monkeypatch) -> None:
    policy = make_policy(seed=6, logit_scale=4.0)
    temperature = torch.linspace(0.5, 1.5, 9)
    lean = policy.sample(
        prompts, 9, min_length=1, max_length=8, temperature=temperature, generator=gen(7)
    )
    _model_path(policy, monkeypatch)
    model = policy.sample(
        prompts, 9, min_length=1, max_length=8, temperature=temperature, generator=gen(7)
    )
    assert torch.equal(lean.tokens, model.tokens) and lean.texts == model.texts
    # sampled under inference mode, the rows leave as ordinary tensors (usable by autograd)
    assert not any(torch.is_inference(t) for t in (lean.tokens, lean.length, lean.log_pf))
    torch.testing.assert_close(lean.log_pf, model.log_pf, atol=1e-5, rtol=0)
    torch.testing.assert_close(lean.log_pterm, model.log_pterm, atol=1e-5, rtol=0)


def test_supports_only_what_it_computes() -> None:
    tokenizer = build_char_tokenizer()
    assert lean_gpt2.supports(build_tiny_model(tokenizer))
    dropout = build_tiny_model(tokenizer)
    dropout.config.attn_pdrop = 0.1
    assert not lean_gpt2.supports(dropout)
    wrapped = get_peft_model(
        build_tiny_model(tokenizer), LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True)
    )
    assert not lean_gpt2.supports(wrapped)
    checkpointed = build_tiny_model(tokenizer)
    checkpointed.config.use_cache = False
    enable = getattr(checkpointed, "activation_checkpointing_enable", None)
    if enable is not None:
        enable()
    else:
        checkpointed.gradient_checkpointing_enable()
    assert not lean_gpt2.supports(checkpointed)


@pytest.mark.parametrize("path", ["lean", "model"])
def test_the_rollout_samples_in_eval_mode_and_leaves_the_mode_as_it_was(path, monkeypatch):
    """transformers' forward samples in eval mode (dropout off) and the model is put back in
    training mode after; the lean forward has no mode, so the rollout switches nothing and draws
    the same rows whatever the mode."""
    policy = make_policy(seed=5)
    if path == "model":
        _model_path(policy, monkeypatch)
    modes: list[bool] = []
    hook = policy.model.transformer.wte.register_forward_hook(
        lambda module, args, out: modes.append(module.training)
    )
    try:
        policy.model.train()
        in_training = policy.sample("24:", 5, min_length=0, max_length=6, generator=gen(3))
        assert policy.model.training and all(m.training for m in policy.model.modules())
        policy.model.eval()
        in_eval = policy.sample("24:", 5, min_length=0, max_length=6, generator=gen(3))
        assert not policy.model.training
    finally:
        hook.remove()
    if path == "model":
        assert modes and not any(modes)  # every forward of the rollout in eval mode
    assert in_training.texts == in_eval.texts
    torch.testing.assert_close(in_training.log_pf, in_eval.log_pf)
