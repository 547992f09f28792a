"""The actions of the prefix tree at each state of given rows: what a constrained rollout
(adapters.lm.rollout) could take there, and the policy's log-probs of them.

A row's state k (its first k tokens) has as children the legal tokens the grammar allows after
them (none at k = max_length) and the stop action, allowed when the text is a complete sentence
and k >= min_length, or when nothing else is (a dead end stops), as the rollout's mask says. The
actions are the policy's sub-vocabulary: the L legal tokens (``policy.legal_ids``) then the stop,
L + 1 columns. The RL losses that average over the children of a state (ROVER's uniform policy)
read these; ``vocabulary_mean_log_prob`` averages over the whole vocabulary instead (the ROVER
authors' choice).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from raptb.adapters.lm.policy import HFPolicy

PerState = Callable[[torch.Tensor], torch.Tensor]


def tree_action_mask(
    policy: HFPolicy, tokens: torch.Tensor, length: torch.Tensor, min_length: int, max_length: int
) -> torch.Tensor:
    """Bool [B, T+1, L+1]: the children of each state k = 0..T of each row of ``tokens`` [B, T]
    (``length`` [B]), over the legal tokens then the stop; the states after a row's stop are all
    False."""
    b, big_t = (int(s) for s in tokens.shape)
    num_legal = len(policy.legal_ids)
    out = torch.zeros(b, big_t + 1, num_legal + 1, dtype=torch.bool)
    if b == 0:
        return out
    grammar = policy.grammar_batch(b)
    if grammar is not None:
        grammar.reset()
    host_tokens, host_length = tokens.tolist(), length.tolist()
    for k in range(big_t + 1):
        if grammar is None:
            mask = torch.ones(b, num_legal + 1, dtype=torch.bool)
        else:
            mask = grammar.next_mask().clone().cpu()
        allowed = mask[:, :num_legal] & (k < max_length)
        can_stop = mask[:, num_legal] & (k >= min_length)
        can_stop |= ~allowed.any(dim=1)
        live = torch.tensor([k <= n for n in host_length])
        out[:, k, :num_legal] = allowed & live[:, None]
        out[:, k, num_legal] = can_stop & live
        moving = [row for row in range(b) if k < host_length[row]]
        if grammar is not None and moving:
            grammar.accept_many(moving, [host_tokens[row][k] for row in moving])
    return out


def sub_vocabulary_log_probs(policy: HFPolicy, temperature: float) -> PerState:
    """``per_state`` for ``HFPolicy.score_with_states``: float32 log-probs [B, T+1, L+1] of the
    legal tokens then the stop under the full softmax of logits / ``temperature`` (the same
    log pi the RL losses train)."""
    sub_ids = torch.tensor([*policy.legal_ids, policy.stop_id], dtype=torch.long)

    def per_state(logits: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() / temperature
        chosen = scaled[..., sub_ids.to(scaled.device)]
        return chosen - torch.logsumexp(scaled, dim=-1, keepdim=True)

    return per_state


def vocabulary_mean_log_prob(temperature: float) -> PerState:
    """``per_state`` for ``HFPolicy.score_with_states``: the mean over the whole vocabulary of the
    log-probs of the softmax of logits / ``temperature``, [B, T+1] (the ROVER authors'
    ``sum_log_softmax``: mean(z) - logsumexp(z))."""

    def per_state(logits: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() / temperature
        return scaled.mean(dim=-1) - torch.logsumexp(scaled, dim=-1)

    return per_state
