"""Activation checkpointing of the rescoring pass on a small random Llama: the gradients of
unchecked rescoring (full fine-tuning and LoRA) with a fraction of the activations kept for
backward, and the rollout (no_grad, KV cache) and the reference pass untouched."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.models import build_char_tokenizer, build_tiny_model
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.tokens import legal_token_ids

TOKENIZER = build_char_tokenizer()
ALPHABET = "abcdefgh"
PROMPT = "x:"
MAX_LENGTH = 12


def _llama(lora: int) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=len(TOKENIZER),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if lora:
        model = apply_lora(model, rank=lora, dropout=0.0)
        with torch.no_grad():  # lora_B starts at zero: give the adapters something to do
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.5)
    return model.train()


def _policy(model: torch.nn.Module) -> HFPolicy:
    stop = TOKENIZER.eos_token_id
    legal = legal_token_ids(TOKENIZER, ALPHABET, stop_id=stop)
    return HFPolicy(model, TOKENIZER, legal_ids=legal, stop_id=stop)


def _trajectories(policy: HFPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    rollout = policy.sample(
        PROMPT, 6, min_length=2, max_length=MAX_LENGTH, generator=torch.Generator().manual_seed(3)
    )
    return rollout.tokens, rollout.length


def _rescoring_gradients(lora: int, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of a loss of the teacher-forced log-probs, and the bytes of activations the
    forward pass kept for backward (what checkpointing saves; weights are not counted)."""
    policy = _policy(_llama(lora))
    # a checkpointed rescoring takes the model's own forward (adapters/lm/paths.py): the plain one
    # takes it too, as a sharded model's (step_together set; one process here), so only
    # checkpointing differs
    policy.step_together = lambda done: done
    if checkpointing:
        policy.enable_activation_checkpointing()
    tokens, length = _trajectories(policy)
    kept: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            kept.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        log_pf, log_pterm = policy.score(PROMPT, tokens, length)
    loss = (log_pf.sum(dim=1) + log_pterm.logsumexp(dim=1) - 1.0).square().mean()
    loss.backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None}
    return grads, sum(kept)


@pytest.mark.parametrize("lora", [0, 4])
def test_checkpointed_rescoring_keeps_fewer_activations_and_gives_the_same_gradients(lora) -> None:
    plain, kept_plain = _rescoring_gradients(lora, checkpointing=False)
    checked, kept = _rescoring_gradients(lora, checkpointing=True)
    # the blocks kept their inputs only (the rest is recomputed in backward): measured 7x less
    assert kept < kept_plain / 4
    assert plain.keys() == checked.keys()
    trained = [n for n, p in _llama(lora).named_parameters() if p.requires_grad]
    assert sorted(plain) == sorted(trained)  # every trained weight (LoRA: the adapters) has one
    for name, grad in plain.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(checked[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lora", [0, 4])
def test_the_rollout_and_the_reference_pass_are_unaffected(lora) -> None:
    plain, checked = _policy(_llama(lora)), _policy(_llama(lora))
    checked.enable_activation_checkpointing()
    # the rollout feeds one token per step against the KV cache (the models are in training
    # mode): a block that checkpointed would drop the cache, see that token alone and sample
    # otherwise
    a, b = (_trajectories(policy) for policy in (plain, checked))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    draw = {"min_length": 2, "max_length": MAX_LENGTH}
    a = plain.sample(PROMPT, 6, generator=torch.Generator().manual_seed(5), **draw)
    b = checked.sample(PROMPT, 6, generator=torch.Generator().manual_seed(5), **draw)
    assert torch.equal(a.log_pf, b.log_pf) and torch.equal(a.log_pterm, b.log_pterm)
    ref_a = plain.reference_score(PROMPT, a.tokens, a.length)
    ref_b = checked.reference_score(PROMPT, b.tokens, b.length)
    assert all(torch.equal(x, y) for x, y in zip(ref_a, ref_b, strict=True))


def test_a_model_without_checkpointing_support_is_a_one_line_error() -> None:
    policy = _policy(build_tiny_model(TOKENIZER))
    policy.enable_activation_checkpointing()  # GPT-2 supports it
    model = torch.nn.Module()
    model.supports_gradient_checkpointing = False
    policy.model = model
    with pytest.raises(ValueError, match="does not support activation checkpointing"):
        policy.enable_activation_checkpointing()
