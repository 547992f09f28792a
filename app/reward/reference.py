"""The reference prior of the per-prefix reward: log P_ref(x_1..x_k + stop), the frozen reference
model's log-probability of every prefix followed by the stop token (kappa's term of log_r_k,
see app.reward)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from raptb.adapters.lm.policy import HFPolicy


def reference_log_prob(
    policy: HFPolicy, prompt: str | Sequence[str], tokens: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """log P_ref(prefix_k + stop) [B, T+1] from the frozen reference model (0 after tau):
    sum_{t<k} ref_log_pf[t] + ref_log_pterm[k]."""
    ref_pf, ref_pterm = policy.reference_score(prompt, tokens, length)
    cum = torch.cat([torch.zeros_like(ref_pf[:, :1]), torch.cumsum(ref_pf, dim=1)], dim=1)
    cols = torch.arange(ref_pterm.shape[1], device=ref_pterm.device)
    return torch.where(cols[None, :] <= length[:, None], cum + ref_pterm, 0.0)
