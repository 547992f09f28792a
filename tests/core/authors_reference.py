"""The authors' lines of the diversity-seeking RL losses, transcribed as written (their libraries,
their constants), for the tests to hold raptb's implementations to.

- ``passk_calc_adv``: RUCAIBox/Passk_Training ``code/passk_adv.py`` ``calc_adv``, commit
  c3ba575ecb31f47fd9f5c43b18c081d4a295f783 (numpy and ``scipy.special.comb``).
- ``ucpo_invq_advantages``: AnamikaLochab/UCPO ``verl/verl/trainer/ppo/core_algos.py``
  ``compute_dgrpo_advantage_outcome_invq_l``, commit 93ce5064d7373babc62b69a4a6b884ebfb7d658b
  (torch; the statistics bookkeeping left out, the arithmetic unchanged). The group id is the
  row's index // num_generations (their ``uid``), their mask the row's tau + 1 actions.
- ``verl_grpo_outcome_advantage`` and ``verl_compute_flowrl``: FlowRL as volcengine/verl keeps it,
  commit f11af2d5358ee808590f11230f9438e9c8f944a5: ``verl/trainer/ppo/core_algos.py``
  ``compute_grpo_outcome_advantage`` (the advantages FlowRL's run script passes as its reward,
  ``adv_estimator=grpo``) and ``recipe/flowrl/flowrl_actor.py`` ``FlowRLActor.compute_flowrl``
  (the metrics left out), with ``verl/utils/torch_functional.py``'s ``masked_sum`` and
  ``masked_mean``. Their ``response_mask`` is the row's tau + 1 actions (the response's EOS is the
  stop), their ``index`` the row's index // num_generations.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import comb


def passk_calc_adv(val: np.ndarray, k: int) -> np.ndarray:
    c = len(np.where(val == 1)[0])
    n = len(val)
    rho = 1 - comb(n - c, k) / comb(n, k)
    sigma = np.sqrt(rho * (1 - rho))
    adv_p = (1 - rho) / (sigma + 1e-6)
    adv_n = (1 - rho - comb(n - c - 1, k - 1) / comb(n - 1, k - 1)) / (sigma + 1e-6)
    new_val = np.where(val == 1, adv_p, val)
    new_val = np.where(new_val == 0, adv_n, new_val)
    return new_val


def ucpo_invq_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_prob: torch.Tensor,
    idx_t: torch.Tensor,
    tau: float = 0.3,
    alpha: float = 0.0,
    epsilon: float = 1e-8,
) -> torch.Tensor:
    """Per-row advantages [B] (their [B, T] output before ``* response_mask``)."""
    scores = token_level_rewards.sum(dim=-1)
    seq_logp = (old_log_prob * response_mask).sum(dim=-1)
    advantages = torch.zeros_like(scores)
    unique_groups = torch.unique(idx_t)
    for gid in unique_groups:
        gmask = idx_t == gid
        group_scores = scores[gmask]
        if group_scores.numel() > 1:
            mean_g = group_scores.mean()
            std_g = group_scores.std(unbiased=True)
            advantages[gmask] = (group_scores - mean_g) / (std_g + epsilon)
        else:
            advantages[gmask] = group_scores - group_scores.mean()
    original_advantages = advantages.clone()
    for gid in unique_groups:
        gidx = torch.nonzero(idx_t == gid, as_tuple=False).squeeze(-1)
        group_logp = seq_logp[gidx]
        group_scores = scores[gidx]
        lengths = (response_mask[gidx] > 0).sum(dim=-1)
        corr_mask = group_scores > 0
        if corr_mask.sum() > 1:
            valid_idx = gidx[corr_mask]
            log_pi = group_logp[corr_mask]
            lens = lengths[corr_mask]
            n_correct = corr_mask.sum().float()
            log_pi_scaled = log_pi / lens
            log_q = log_pi_scaled - torch.logsumexp(log_pi_scaled, dim=0)
            log_q = log_q.detach()
            q = log_q.exp()
            q_clamped = q.clamp(min=1e-6)
            inv_q = 1.0 / q_clamped
            target_weights = inv_q / inv_q.sum()
            uniform_weights = torch.ones_like(q) / n_correct
            blended_weights = (1.0 - tau) * uniform_weights + tau * target_weights
            A_base = original_advantages[valid_idx[0]]
            per_response_weights = blended_weights * n_correct
            new_advantages = A_base * per_response_weights
            advantages[valid_idx] = new_advantages.detach()
        inc_mask = ~corr_mask
        if inc_mask.sum() > 1 and alpha > 0:
            bad_idx = gidx[inc_mask]
            log_pi = group_logp[inc_mask]
            lens = lengths[inc_mask]
            log_pi_scaled = log_pi / lens
            log_q = log_pi_scaled - torch.logsumexp(log_pi_scaled, dim=0)
            log_q = log_q.detach()
            q = log_q.exp()
            Hq = -(q * log_q).sum()
            surprisal = -log_q
            centered_term = surprisal - Hq
            penalty = alpha * centered_term
            penalty = torch.clamp(penalty, min=0.0)
            advantages[bad_idx] -= penalty.detach()
    return advantages


def trl_entropy_loss(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    num_items_in_batch: float,
    num_processes: int,
    gradient_accumulation_steps: int,
) -> torch.Tensor:
    """huggingface/trl ``trl/trainer/grpo_trainer.py`` ``_compute_loss``, commit
    f2cd57710ae345ea6428ae95363267fcf38a3dc8: the entropy term of one micro-batch (train mode,
    no entropy mask), which the loss subtracts times the applied coefficient."""
    if loss_type in ["cispo", "dapo", "vespo"]:
        normalizer = torch.tensor(float(num_items_in_batch)).clamp(min=1.0) / num_processes
        return (entropies * mask).sum() / normalizer
    normalizer = gradient_accumulation_steps
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0) / normalizer


class TRLAdaptiveEntropy:
    """The same file's adaptive controller: ``__init__`` (``_last_world_entropy = inf``), the
    applied coefficient and the update at the optimizer-step boundary, one process."""

    def __init__(self, entropy_coef, entropy_target, entropy_coef_delta, coef_min, coef_max):
        self.entropy_coef = entropy_coef
        self.entropy_target = entropy_target
        self.entropy_coef_delta = entropy_coef_delta
        self.entropy_coef_min = coef_min
        self.entropy_coef_max = coef_max
        self._last_world_entropy = float("inf")

    def apply_coef(self) -> float:
        return self.entropy_coef if self._last_world_entropy <= self.entropy_target else 0.0

    def step(self, window_stats: torch.Tensor) -> None:
        world_entropy = (window_stats[0] / window_stats[1].clamp(min=1.0)).item()
        if world_entropy <= self.entropy_target:
            self.entropy_coef = min(
                self.entropy_coef + self.entropy_coef_delta, self.entropy_coef_max
            )
        else:
            self.entropy_coef = max(
                self.entropy_coef - self.entropy_coef_delta, self.entropy_coef_min
            )
        self._last_world_entropy = world_entropy


def rover_compute_rover_reward(
    token_level_rewards: torch.Tensor,
    eos_mask: torch.Tensor,
    index,
    norm_adv_by_std_in_grpo: bool = False,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """tinnerhrhe/ROVER ``Countdown/verl/trainer/ppo/core_algos.py`` ``compute_rover_reward``,
    commit b0fa5878a0c7a29a9d18205b19d024b779b0609c (``step`` unused there, left out)."""
    from collections import defaultdict

    response_length = token_level_rewards.shape[-1]
    non_zero_mask = token_level_rewards != 0
    scores = (token_level_rewards * non_zero_mask).sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1).tile([1, response_length]) * eos_mask
    return scores


def rover_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    current_q: torch.Tensor,
    old_logits: torch.Tensor,
    low_var_reward: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """The same commit's ``Countdown/verl/workers/actor/dp_actor.py``
    ``DataParallelROVERActor.update_policy`` (one micro-batch, before ``/ gradient_accumulation``)
    with ``core_algos.compute_rover_loss``: ``current_q`` / ``old_logits`` are the per-state
    means of the log-softmax (``sum_log_softmax``) under the current and the old policy."""
    q_values = log_prob - old_log_prob
    q_values = q_values * response_mask
    next_q = torch.cat(
        [
            (current_q[:, 1:] - old_logits[:, 1:]) * response_mask[:, 1:],
            torch.zeros_like(q_values[:, :1]),
        ],
        dim=1,
    ).detach()
    target = low_var_reward.float() + next_q
    loss = (q_values.float() - target.float().detach()) ** 2
    return (loss * response_mask).sum() / response_mask.sum()


def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    from collections import defaultdict

    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_compute_flowrl(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_z: torch.Tensor,
    reward: torch.Tensor,
    response_mask: torch.Tensor,
    flowrl_beta_coef: float = 15.0,
) -> torch.Tensor:
    """``compute_flowrl`` (``self.flowrl_beta_coef`` a parameter; ``log_z`` [B, 1], ProjZ's)."""
    log_z = log_z.squeeze(-1)
    avg_log_prob = verl_masked_mean(log_prob, response_mask, axis=1)
    avg_ref_log_prob = verl_masked_mean(ref_log_prob, response_mask, axis=1)
    seq_log_reward = verl_masked_mean(reward, response_mask, axis=1)
    delta = log_z + avg_log_prob - flowrl_beta_coef * seq_log_reward - avg_ref_log_prob
    log_w = verl_masked_sum(log_prob - old_log_prob, response_mask, axis=1)
    imp_w_raw = torch.exp(log_w).detach()
    imp_w = torch.clamp(imp_w_raw, max=10)
    weighted_losses = imp_w * (delta**2)
    avg_loss = torch.mean(weighted_losses)
    return avg_loss
