"""PPO value head: a linear map from the policy's last hidden state to V(s_{0:k}).

Shares the policy's backbone (as TRL's ``AutoModelForCausalLMWithValueHead`` did): dropout, then
``Linear(hidden_size, 1)`` in float32, whatever the backbone's dtype, so the value regression does
not run in bf16. TRL's value head uses dropout 0.1 (``summary_dropout_prob``); that is the default.

Alignment with the action layout (``core.rl.batch``): the teacher-forced input is the prompt (P
tokens) followed by the T generated-token columns; the hidden state at position P - 1 + k is the
state of prefix s_{0:k}, the one the policy's logits for action k come from. ``prefix_values``
therefore reads positions P - 1 .. P - 1 + T, giving [B, T+1] values, 0 after tau.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """V(s) = w . dropout(h) + b on hidden states [..., hidden_size] -> float32 values [...]."""

    def __init__(self, hidden_size: int, dropout: float = 0.1) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size: must be >= 1, got {hidden_size}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: must lie in [0, 1), got {dropout}")
        self.dropout = nn.Dropout(dropout)
        self.summary = nn.Linear(hidden_size, 1, dtype=torch.float32)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(self.dropout(hidden.float())).squeeze(-1)


def prefix_values(
    head: ValueHead, hidden: torch.Tensor, prompt_len: int, length: torch.Tensor
) -> torch.Tensor:
    """Values [B, T+1] of prefix states 0..T from last hidden states [B, P + T, H].

    ``hidden`` is the backbone's last layer on the prompt (``prompt_len`` = P >= 1 tokens) plus
    the T generated-token columns; columns after tau (``length`` [B]) are set to 0.
    """
    if hidden.ndim != 3:
        raise ValueError(f"hidden: expected shape [B, P + T, H], got {tuple(hidden.shape)}")
    b, n, _ = hidden.shape
    if prompt_len < 1 or prompt_len > n:
        raise ValueError(f"prompt_len: must lie in [1, {n}], got {prompt_len}")
    if tuple(length.shape) != (b,):
        raise ValueError(f"length: expected shape [{b}], got {tuple(length.shape)}")
    values = head(hidden[:, prompt_len - 1 :, :])
    cols = torch.arange(values.shape[1], device=values.device)
    return torch.where(cols[None, :] <= length.to(values.device)[:, None], values, 0.0)
