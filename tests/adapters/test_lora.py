"""LoRA: target modules per architecture, reference = adapter disabled, plain-peft round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import LlamaConfig, LlamaForCausalLM

from raptb.adapters.lm.lora import (
    apply_lora,
    is_adapter_folder,
    load_adapter_weights,
    lora_target_modules,
)
from raptb.adapters.lm.models import build_char_tokenizer, build_tiny_model
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.tokens import legal_token_ids
from raptb.adapters.tasks.smiles.task import SmilesTask

TOKENIZER = build_char_tokenizer()
TASK = SmilesTask()
PROMPT = TASK.prompts()[0]


def _tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(TOKENIZER),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _policy(model: torch.nn.Module) -> HFPolicy:
    stop = TOKENIZER.eos_token_id
    legal = legal_token_ids(TOKENIZER, TASK.alphabet, stop_id=stop)
    return HFPolicy(model, TOKENIZER, legal_ids=legal, stop_id=stop, grammar=TASK.grammar)


def _perturb_adapter(model: PeftModel) -> None:
    # lora_B starts at zero, which would make the adapted model equal the base one
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)


def test_target_modules_per_architecture() -> None:
    assert lora_target_modules(build_tiny_model(TOKENIZER)) == ["c_attn", "c_fc", "c_proj"]
    assert lora_target_modules(_tiny_llama()) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    with pytest.raises(ValueError, match="lora: no attention/MLP projection"):
        lora_target_modules(torch.nn.Sequential(torch.nn.Linear(2, 2)))  # type: ignore[arg-type]


@pytest.mark.parametrize("build", [lambda: build_tiny_model(TOKENIZER), _tiny_llama])
def test_only_adapter_weights_require_grad(build) -> None:  # type: ignore[no-untyped-def]
    model = apply_lora(build(), rank=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    config = model.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout, config.bias) == (4, 16, 0.1, "none")


@pytest.mark.parametrize("build", [lambda: build_tiny_model(TOKENIZER), _tiny_llama])
def test_reference_log_probs_equal_the_base_model(build) -> None:  # type: ignore[no-untyped-def]
    base = _policy(build())
    adapted = _policy(apply_lora(build(), rank=4))
    _perturb_adapter(adapted.model)
    rollout = adapted.sample(PROMPT, 6, min_length=1, max_length=10)
    expected = base.score(PROMPT, rollout.tokens, rollout.length)
    reference = adapted.reference_score(PROMPT, rollout.tokens, rollout.length)
    for want, got in zip(expected, reference, strict=True):
        torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=0)
    adapted.model.eval()  # no dropout: the adapted values must differ from the base ones
    changed = adapted.score(PROMPT, rollout.tokens, rollout.length)[0]
    assert not torch.allclose(changed, expected[0], atol=1e-3)
    assert adapted._frozen_copy is None


def test_adapter_saves_for_plain_peft(tmp_path: Path) -> None:
    model = apply_lora(_tiny_llama(), rank=4)
    _perturb_adapter(model)
    model.save_pretrained(tmp_path)
    assert is_adapter_folder(tmp_path)
    ids = torch.tensor([[1, 5, 9, 33]])
    model.eval()
    want = model(input_ids=ids).logits
    loaded = PeftModel.from_pretrained(_tiny_llama(), tmp_path).eval()
    torch.testing.assert_close(loaded(input_ids=ids).logits, want)
    # and into an existing adapter (checkpoint resume)
    fresh = apply_lora(_tiny_llama(), rank=4).eval()
    load_adapter_weights(fresh, tmp_path)
    torch.testing.assert_close(fresh(input_ids=ids).logits, want)
    with pytest.raises(ValueError, match="checkpoint"):
        load_adapter_weights(fresh, tmp_path / "nothing")
