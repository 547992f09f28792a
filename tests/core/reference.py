"""Slow, obviously-correct float64 references of the objectives: explicit loops over
trajectories, prefixes and windows, written from the paper's formulas (not from core's code)."""

from __future__ import annotations

import math

import numpy as np


def _delta(bt: dict, b: int, k: int, log_z: float) -> float:
    return (
        log_z
        + sum(float(bt["log_pf"][b, t]) for t in range(k))
        + float(bt["log_pterm"][b, k])
        - float(bt["log_r"][b, k])
    )


def _lz(log_z, b: int) -> float:
    return float(np.asarray(log_z).reshape(-1)[b]) if np.ndim(log_z) else float(log_z)


def tb(bt: dict, log_z) -> float:
    n = len(bt["length"])
    return sum(_delta(bt, b, int(bt["length"][b]), _lz(log_z, b)) ** 2 for b in range(n)) / n


def subtb(bt: dict, lam: float = 1.0, normalization: str = "trajectory") -> float:
    per, nums, dens = [], 0.0, 0.0
    for b in range(len(bt["length"])):
        tau = int(bt["length"][b])
        num = den = 0.0
        for i in range(tau + 1):
            for j in range(i + 1, tau + 1):
                eps = (
                    sum(float(bt["log_pf"][b, t]) for t in range(i, j))
                    + bt["log_r"][b, i]
                    - bt["log_r"][b, j]
                    + bt["log_pterm"][b, j]
                    - bt["log_pterm"][b, i]
                )
                w = lam ** (j - i - 1)
                num += w * eps**2
                den += w
        per.append(num / den if den > 0 else 0.0)
        nums += num
        dens += den
    if normalization == "trajectory":
        return sum(per) / len(per)
    return nums / dens if dens > 0 else 0.0


def targets_row(u: list[float], h: int, alpha: float, beta: float, rho: float, mode: str):
    out = []
    for k in range(len(u)):
        if k > h:
            out.append(-math.inf)
            continue
        umax = max(u[j] for j in range(k, h + 1))
        terms = [beta * u[j] - beta * rho * (j - k) for j in range(k, h + 1)]
        m = max(terms)
        usoft = (m + math.log(sum(math.exp(x - m) for x in terms))) / beta
        out.append({"max": umax, "soft": usoft, "mix": alpha * umax + (1 - alpha) * usoft}[mode])
    return out


def raptb(
    bt: dict,
    log_z,
    *,
    eta=0.25,
    gamma=0.99,
    alpha=0.8,
    beta=3.0,
    rho=0.5,
    k_min=1,
    horizon=None,
    target="mix",
    absorb_eps=1e-6,
    subtb_lambda=1.0,
    absorb=True,
) -> tuple[float, list[float]]:
    """Returns (loss, per-trajectory aux); ``absorb=False`` takes u_tgt = u (no correction)."""
    total, auxes = 0.0, []
    n = len(bt["length"])
    for b in range(n):
        tau = int(bt["length"][b])
        h = tau if horizon is None else min(tau, horizon)
        u = [float(x) for x in bt["u"][b]]
        tgt = targets_row(u, h, alpha, beta, rho, target)
        d0 = _delta(bt, b, 0, 0.0)
        num = den = 0.0
        for k in range(max(k_min, 1), h + 1):
            rbar = _delta(bt, b, k, 0.0) - d0
            a = gamma ** (h - k) if absorb and abs(u[k]) <= absorb_eps else 0.0
            rhat = rbar + (a * (u[k] - tgt[k]) if a else 0.0)
            w = subtb_lambda ** (k - k_min)
            num += w * rhat**2
            den += w
        aux = num / den if den > 0 else 0.0
        auxes.append(aux)
        total += _delta(bt, b, tau, _lz(log_z, b)) ** 2 + eta * aux
    return total / n, auxes


def prefix_mean(bt: dict, log_z, lam: float = 1.0) -> float:
    total = 0.0
    n = len(bt["length"])
    for b in range(n):
        tau = int(bt["length"][b])
        ks = range(1, tau + 1) if tau >= 1 else [0]
        ws = [lam ** max(k - 1, 0) for k in ks]
        ds = [_delta(bt, b, k, _lz(log_z, b)) ** 2 for k in ks]
        total += sum(w * d for w, d in zip(ws, ds, strict=True)) / sum(ws)
    return total / n


def vargrad(bt: dict) -> float:
    n = len(bt["length"])
    r = [_delta(bt, b, int(bt["length"][b]), 0.0) for b in range(n)]
    mean = sum(r) / n
    return sum((x - mean) ** 2 for x in r) / n
