"""TRL's padded completions in raptb's prefix layout, and their log-probabilities in one forward.

TRL hands a batch as left-padded prompts ``prompt_ids`` [B, P] and right-padded completions
``completion_ids`` [B, C] with masks. A completion that ends with an EOS token is a trajectory of
tau = n - 1 tokens whose stop is that EOS (n = its unpadded length); one cut at
``max_completion_length`` without EOS is a trajectory of tau = n tokens whose stop is forced
there, as raptb's rollout forces it at ``max_length``. The stop action is "any EOS id": its
log-probability at a prefix is the log-sum-exp of the EOS columns (the EOS column itself when the
model has one EOS id).

``prefix_log_probs`` computes, from one forward pass over prompt + completion, the untempered
float32 log-softmax at the C + 1 prefixes k = 0..C (the logits of positions P - 1 .. P + C - 1):

    log_pf    [B, C]    column t = log P_F(c_{t+1} | prompt, c_1..c_t) for t < tau, 0 after
    log_pterm [B, C+1]  column k = log P_F(stop | prompt, c_1..c_k) for k <= tau, 0 after
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def trajectory_lengths(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_ids: Sequence[int]
) -> torch.Tensor:
    """tau [B]: each completion's token count before its stop (EOS excluded)."""
    n = completion_mask.sum(dim=1).long()
    last = completion_ids.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
    eos = torch.tensor(list(eos_ids), dtype=completion_ids.dtype, device=completion_ids.device)
    stopped = (n > 0) & torch.isin(last, eos)
    return n - stopped.long()


def prefix_log_probs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    length: torch.Tensor,
    eos_ids: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_pf [B, C], log_pterm [B, C+1])`` of the completions under ``model`` (module
    docstring), with gradients when enabled. The model's own forward returns the logits (not
    TRL's fused head, which scores only the sampled tokens, at the sampling temperature)."""
    big_c = completion_ids.shape[1]
    out = model(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, completion_mask], dim=1),
        use_cache=False,
        logits_to_keep=big_c + 1,
    )
    logits = out.logits[:, -(big_c + 1) :, :].float()
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = logits[:, :big_c].gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    stop = torch.logsumexp(logits[..., list(eos_ids)], dim=-1) - log_norm
    cols = torch.arange(big_c + 1, device=logits.device)
    log_pf = torch.where(cols[None, :big_c] < length[:, None], chosen - log_norm[:, :big_c], 0.0)
    log_pterm = torch.where(cols[None, :] <= length[:, None], stop, 0.0)
    return log_pf, log_pterm


def stop_log_prob(
    log_pf: torch.Tensor, log_pterm: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """log P(prefix_k + stop) [B, C+1] = sum_{t<k} log_pf[t] + log_pterm[k] for k <= tau, 0 after
    (the reference model's log-probability of each prefix followed by the stop)."""
    cum = torch.cat([torch.zeros_like(log_pf[:, :1]), torch.cumsum(log_pf, dim=1)], dim=1)
    cols = torch.arange(log_pterm.shape[1], device=log_pterm.device)
    return torch.where(cols[None, :] <= length[:, None], cum + log_pterm, 0.0)
