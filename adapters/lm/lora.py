"""LoRA adapters (peft) on the attention and MLP projections of any causal LM.

The paper fine-tunes with rank 16, alpha 16, dropout 0.1 and no bias on the q/k/v/o/gate/up/down
projections. Module names differ per architecture, so the targets are found by name among the
model's linear layers:

- Llama-like (Llama, Mistral, Qwen, SmolLM2): ``q_proj k_proj v_proj o_proj gate_proj up_proj
  down_proj``;
- GPT-2: ``c_attn`` (fused q/k/v), ``c_proj`` (attention output and MLP output), ``c_fc``
  (``transformers.pytorch_utils.Conv1D`` layers, whose weights peft transposes:
  ``fan_in_fan_out``);
- GPT-NeoX / Pythia: ``query_key_value dense dense_h_to_4h dense_4h_to_h``; Falcon likewise.

Only the adapter weights require gradients afterwards. The reference model log P_ref is the same
module with ``disable_adapter()`` (see ``HFPolicy.reference_score``), never a second copy.
Checkpoints hold the adapter alone (``save_pretrained``: ``adapter_config.json`` and
``adapter_model.safetensors``), which plain ``peft.PeftModel.from_pretrained(base, folder)`` loads.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from raptb.adapters.lm.cpu_dropout import use_fast_dropout

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# ``PeftModel.save_pretrained``'s default (``save_embedding_layers="auto"``) reads the base
# model's config.json, from its folder or the Hub, to see whether its vocabulary was resized; a
# model read from GGUF has none there (peft warns "Could not find a config file"), and online a
# local folder would be asked of the Hub. LoRA here adapts projections only and never resizes the
# vocabulary: the adapter is saved without the embedding layers, as "auto" would decide.
ADAPTER_SAVE_OPTIONS = {"save_embedding_layers": False}
# Leaf names of attention and MLP projections, by architecture family (module docstring).
PROJECTION_NAMES = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "c_attn",
        "c_proj",
        "c_fc",
        "query_key_value",
        "dense",
        "dense_h_to_4h",
        "dense_4h_to_h",
    }
)


def lora_target_modules(model: PreTrainedModel) -> list[str]:
    """Sorted distinct leaf names of the model's linear/Conv1D projections that LoRA adapts.

    Raises ValueError when the architecture has none of the known projection names.
    """
    found = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D)
        and name.rsplit(".", 1)[-1] in PROJECTION_NAMES
    }
    if not found:
        raise ValueError(
            f"lora: no attention/MLP projection found in {type(model).__name__} (known names: "
            f"{', '.join(sorted(PROJECTION_NAMES))})"
        )
    return sorted(found)


def is_peft_model(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


def apply_lora(
    model: PreTrainedModel, *, rank: int, alpha: float = 16.0, dropout: float = 0.1
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters (no bias) on its projections; base weights frozen."""
    if rank < 1:
        raise ValueError(f"lora.rank: must be >= 1, got {rank}")
    targets = lora_target_modules(model)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        bias="none",
        target_modules=targets,
        # GPT-2's Conv1D stores weights as [in, out]
        fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 reads transformers 5's deprecated alias ``model.is_gradient_checkpointing``
        # (of ``is_activation_checkpointing``, the same value) to decide whether to prepare the
        # model for checkpointing: that one read's FutureWarning is the library's, not the run's
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        wrapped = get_peft_model(model, config)
    use_fast_dropout(wrapped)  # the same dropout, its mask drawn ~20x faster on a CPU
    return wrapped


def is_adapter_folder(folder: Path | str) -> bool:
    """Whether ``folder`` holds a peft adapter (as written by ``PeftModel.save_pretrained``)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def load_adapter_weights(model: PeftModel, folder: Path | str) -> None:
    """Copy the adapter weights saved in ``folder`` into ``model``'s (same config) adapter."""
    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ValueError(f"checkpoint: {path} does not exist (not a LoRA checkpoint)")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    if result.unexpected_keys:
        raise ValueError(
            f"checkpoint: {path} does not match the model's adapter (unexpected keys, e.g. "
            f"{result.unexpected_keys[0]}); was it trained with another --lora-rank or model?"
        )


def preferred_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a CUDA device that supports it, float32 otherwise: ``model_dtype = "auto"``'s
    choice (a CPU runs bfloat16 only when asked, ``adapters.lm.precision``)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32
