"""PPO value head: alignment with prefix states, masking, dtype, gradients through the PPO loss."""

from __future__ import annotations

import pytest
import torch

from raptb.adapters.lm.value_head import ValueHead, prefix_values
from raptb.core.rl.batch import RLBatch
from raptb.core.rl.ppo import PPO


def test_prefix_values_read_the_state_of_each_prefix():
    torch.manual_seed(0)
    head = ValueHead(4, dropout=0.0)
    hidden = torch.randn(2, 3 + 2, 4)  # P = 3 prompt tokens, T = 2 generated columns
    length = torch.tensor([2, 0])
    values = prefix_values(head, hidden, 3, length)
    assert values.shape == (2, 3) and values.dtype == torch.float32
    # prefix k's state is the hidden state at position P - 1 + k
    expected = hidden[:, 2:, :] @ head.summary.weight[0] + head.summary.bias
    torch.testing.assert_close(values[0], expected[0])
    torch.testing.assert_close(values[1, 0], expected[1, 0])
    assert torch.all(values[1, 1:] == 0)  # tau = 0: only the prompt state is visited


def test_value_head_is_float32_on_a_bf16_backbone():
    head = ValueHead(8, dropout=0.0)
    out = head(torch.randn(3, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == (3,)


def test_bad_arguments():
    with pytest.raises(ValueError, match="hidden_size"):
        ValueHead(0)
    with pytest.raises(ValueError, match="dropout"):
        ValueHead(4, dropout=1.0)
    head = ValueHead(4)
    with pytest.raises(ValueError, match="prompt_len"):
        prefix_values(head, torch.zeros(1, 3, 4), 0, torch.tensor([0]))
    with pytest.raises(ValueError, match="hidden"):
        prefix_values(head, torch.zeros(3, 4), 1, torch.tensor([0]))


def test_ppo_value_loss_trains_the_head():
    torch.manual_seed(1)
    head = ValueHead(4, dropout=0.0)
    hidden = torch.randn(2, 2 + 3, 4)
    length = torch.tensor([3, 1])
    values = prefix_values(head, hidden, 2, length)
    log_probs = torch.log(torch.rand(2, 4)).requires_grad_()
    batch = RLBatch(
        log_probs=log_probs,
        old_log_probs=log_probs.detach(),
        rewards=torch.tensor([1.0, 0.0]),
        length=length,
        values=values,
        old_values=values.detach(),
    )
    loss, diag = PPO(kl_coef=0.0)(batch)
    loss.backward()
    assert head.summary.weight.grad is not None
    assert torch.count_nonzero(head.summary.weight.grad) > 0
    assert diag["value_clip_frac"] == 0.0  # first pass: values equal the old values
