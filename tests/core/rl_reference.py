"""Slow float64 references for the RL baselines: plain loops over rows and actions, python floats.

Each follows the written formula of ``core.rl.advantages``, ``core.rl.grpo`` and ``core.rl.ppo``
(TRL's conventions) with no vectorisation, so the vectorised code is checked against an obviously
correct reading. Arrays come in as nested sequences [B][T+1]; only columns t <= tau are read.
"""

from __future__ import annotations

import math


def bessel_std(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def group_advantages(
    rewards: list[float], num_generations: int, scale_rewards: str
) -> tuple[list[float], list[float]]:
    b = len(rewards)
    adv, std = [0.0] * b, [0.0] * b
    batch_std = bessel_std(list(rewards))
    for g in range(b // num_generations):
        rows = range(g * num_generations, (g + 1) * num_generations)
        group = [rewards[i] for i in rows]
        mean = sum(group) / num_generations
        s = batch_std if scale_rewards == "batch" else bessel_std(group)
        for i in rows:
            centred = rewards[i] - mean
            adv[i] = centred if scale_rewards == "none" else centred / (s + 1e-4)
            std[i] = s
    return adv, std


def whiten(values: list[float], shift_mean: bool) -> list[float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    out = [(v - mean) / math.sqrt(var + 1e-8) for v in values]
    return out if shift_mean else [v + mean for v in out]


def gae_row(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """TRL's backward recursion over one row's actions 0..tau (the value after the stop is 0)."""
    n = len(rewards)
    adv = [0.0] * n
    last = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def k3(log_p: float, ref: float) -> float:
    gap = ref - log_p
    return math.exp(gap) - gap - 1.0


def grpo_loss(
    logp, old, ref, rewards, length, cfg: dict, num_items_in_batch=None, grad_accum=1
) -> float:
    """GRPO loss of one micro-batch, loop form of ``core.rl.grpo``'s docstring."""
    b = len(rewards)
    width = len(logp[0])
    adv, _ = group_advantages(list(rewards), cfg["num_generations"], cfg["scale_rewards"])
    eps = cfg["epsilon"]
    eps_high = eps if cfg["epsilon_high"] is None else cfg["epsilon_high"]
    loss_type = cfg["loss_type"]
    rows: list[list[float]] = []
    for i in range(b):
        n = int(length[i]) + 1
        a = adv[i]
        seq_log_w = sum(logp[i][t] - old[i][t] for t in range(n)) / n
        row = []
        for t in range(n):
            log_w = (
                seq_log_w
                if cfg["importance_sampling_level"] == "sequence"
                else (logp[i][t] - old[i][t])
            )
            w = math.exp(log_w)
            if loss_type == "cispo":
                term = -min(w, eps_high) * a * logp[i][t]
            elif loss_type == "sapo":
                s = cfg["sapo_temperature_pos"] if a > 0 else cfg["sapo_temperature_neg"]
                term = -(1.0 / (1.0 + math.exp(-s * (w - 1.0)))) * 4.0 / s * a
            else:
                clipped = min(max(w, 1.0 - eps), 1.0 + eps_high)
                w1 = w if cfg["delta"] is None else min(w, cfg["delta"])
                term = -min(w1 * a, clipped * a)
            if cfg["beta"] != 0.0:
                kl = k3(logp[i][t], ref[i][t])
                term += cfg["beta"] * (kl * w if cfg["use_bias_correction_kl"] else kl)
            row.append(term)
        rows.append(row)
    total = sum(sum(r) for r in rows)
    count = sum(len(r) for r in rows)
    if loss_type in ("grpo", "sapo"):
        return sum(sum(r) / len(r) for r in rows) / b
    if loss_type == "bnpo":
        return total / count
    if loss_type == "dr_grpo":
        return total / (b * (cfg["max_completion_length"] or width))
    if loss_type in ("dapo", "cispo"):
        if num_items_in_batch is None:
            return total / count
        return total / (num_items_in_batch / grad_accum)
    return sum(sum(r) for r in rows) / b  # luspo


def ppo_loss(logp, old, ref, rewards, length, values, old_values, cfg: dict, rows=None) -> float:
    """PPO loss of one micro-batch, loop form of ``core.rl.ppo``'s docstring; with ``rows``, the
    loss of those rows only, their advantages whitened over every row (one PPO mini-batch)."""
    b = len(rewards)
    ns = [int(length[i]) + 1 for i in range(b)]
    tok_r = []
    for i in range(b):
        row = []
        for t in range(ns[i]):
            r = 0.0
            if ref is not None:
                if cfg["kl_estimator"] == "k1":
                    kl = old[i][t] - ref[i][t]
                else:
                    kl = k3(old[i][t], ref[i][t])
                r -= cfg["kl_coef"] * kl
            if t == ns[i] - 1:
                r += rewards[i]
            row.append(r)
        tok_r.append(row)
    if cfg["whiten_rewards"]:
        flat = whiten([r for row in tok_r for r in row], shift_mean=False)
        tok_r = _unflatten(flat, ns)
    advs, rets = [], []
    for i in range(b):
        a, g = gae_row(tok_r[i], list(old_values[i][: ns[i]]), cfg["gamma"], cfg["lam"])
        advs.append(a)
        rets.append(g)
    if cfg["whiten_advantages"]:
        advs = _unflatten(whiten([a for row in advs for a in row], shift_mean=True), ns)
    pg, vf = [], []
    cr, cv = cfg["cliprange"], cfg["cliprange_value"]
    for i in range(b) if rows is None else rows:
        for t in range(ns[i]):
            ratio = math.exp(logp[i][t] - old[i][t])
            a = advs[i][t]
            pg.append(max(-a * ratio, -a * min(max(ratio, 1.0 - cr), 1.0 + cr)))
            v, v_old, g = values[i][t], old_values[i][t], rets[i][t]
            v_clip = min(max(v, v_old - cv), v_old + cv)
            vf.append(max((v - g) ** 2, (v_clip - g) ** 2))
    return sum(pg) / len(pg) + cfg["vf_coef"] * 0.5 * sum(vf) / len(vf)


def _unflatten(flat: list[float], ns: list[int]) -> list[list[float]]:
    out, k = [], 0
    for n in ns:
        out.append(flat[k : k + n])
        k += n
    return out
