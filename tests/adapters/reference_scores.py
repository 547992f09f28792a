"""The reference every rescoring path is held to: transformers' own forward of each row's
``cat(prompt, body)`` alone (no padding, no cache, no shared prompt, no merged copies), its
log-softmax read at the row's tokens and at the stop (tests' helper, not a test module)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def reference_scores(
    model: torch.nn.Module,
    prompt_rows: Sequence[Sequence[int]],
    tokens: torch.Tensor,
    length: torch.Tensor,
    stop_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_pf [B, T], log_pterm [B, T + 1]) of rows ``tokens`` [B, T] of ``length`` [B] after
    prompt ids ``prompt_rows`` (one list per row): row b's model forward over its prompt and its
    first length[b] tokens, log softmax(logits / temperature) at each state 0..length[b];
    0 after."""
    b, big_t = tokens.shape
    log_pf = torch.zeros(b, big_t)
    log_pterm = torch.zeros(b, big_t + 1)
    pf_rows, pterm_rows = [], []
    for prompt, row, tau in zip(prompt_rows, tokens.tolist(), length.tolist(), strict=True):
        ids = torch.tensor([[*prompt, *row[:tau]]])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 :]  # [tau + 1, V]
        log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
        pf = log_p[:tau].gather(1, torch.tensor(row[:tau], dtype=torch.long)[:, None])[:, 0]
        pf_rows.append(torch.cat([pf, log_pf.new_zeros(big_t - tau)]))
        pterm_rows.append(torch.cat([log_p[:, stop_id], log_pterm.new_zeros(big_t - tau)]))
    if not pf_rows:
        return log_pf, log_pterm
    return torch.stack(pf_rows), torch.stack(pterm_rows)


def weighted_grads(
    outputs: Sequence[torch.Tensor], params: Sequence[torch.nn.Parameter], seed: int
) -> list[torch.Tensor]:
    """Gradients of a random weighted sum of ``outputs`` (the same weights for the same seed and
    shapes) with respect to ``params``."""
    g = torch.Generator().manual_seed(seed)
    total = sum((out * torch.rand(out.shape, generator=g)).sum() for out in outputs)
    return [
        torch.zeros_like(p) if grad is None else grad
        for p, grad in zip(
            params, torch.autograd.grad(total, list(params), allow_unused=True), strict=True
        )
    ]


def assert_grads_close(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> None:
    """Each gradient within 2e-5 of the largest entry of any (float32 sums reordered over hundreds
    of terms; a parameter whose gradient is tiny gets no tighter bound) plus 1e-3 relative (a
    random Llama's prompt forwarded once against every row's forward: one entry measured 6.7e-4
    off, 2026-12-03)."""
    scale = max(float(w.abs().max()) for w in want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5 * scale, rtol=1e-3)
