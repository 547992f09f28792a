"""The action layout shared by the reward-maximising RL baselines (PPO and GRPO).

The RL policy acts on the same terminable prefix tree as the GFlowNet objectives
(``core.gfn.batch``), but it is scored per *action*: a sampled sequence of tau tokens is tau
token actions followed by the stop action, so there are A = T + 1 action columns

    column t < tau : the (t+1)-th generated token,  log pi = log_pf[t]
    column tau     : the stop action,               log pi = log_pterm[tau]
    column t > tau : padding (never read)

and log pi(sequence) = sum_{t<tau} log_pf[t] + log_pterm[tau]. Action column k is taken at prefix
state k, so per-state arrays such as the PPO values V(s_{0:k}) share the same [B, T+1] columns.

    log_probs      [B, T+1]  current policy log-probs of the sampled actions (with gradients)
    old_log_probs  [B, T+1]  behaviour log-probs at sampling time (no gradient is taken)
    ref_log_probs  [B, T+1]  reference-model log-probs (adapter disabled), or None
    rewards        [B]       terminal (sequence) reward
    length         [B]       tau_b, an integer in [0, T]
    values         [B, T+1]  PPO: current value predictions V(s_{0:k}), or None
    old_values     [B, T+1]  PPO: value predictions at sampling time, or None
    entropy        [B, T+1]  entropy of the full policy distribution at each state, or None

Arrays may be numpy or torch (one namespace per batch, ``array-api-compat``). Values after tau are
never read; the losses zero them before any arithmetic, so they may hold anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from array_api_compat import array_namespace, device

Array = Any

_ACTION_FIELDS = (
    "log_probs",
    "old_log_probs",
    "ref_log_probs",
    "values",
    "old_values",
    "entropy",
)


def action_log_probs(log_pf: Array, log_pterm: Array, length: Array) -> Array:
    """[B, T+1] action log-probs from prefix-layout ``log_pf`` [B, T] and ``log_pterm`` [B, T+1].

    Column t < tau is log_pf[t], column tau is log_pterm[tau] (the stop is an action), 0 after.
    Gradients flow to both inputs through the selected entries only.
    """
    xp = array_namespace(log_pf, log_pterm, length)
    b, t = (int(s) for s in log_pf.shape)
    if tuple(int(s) for s in log_pterm.shape) != (b, t + 1):
        raise ValueError(f"log_pterm: expected shape [{b}, {t + 1}], got {tuple(log_pterm.shape)}")
    cols = xp.arange(t + 1, device=device(length))[None, :]
    padded = xp.concat([log_pf, xp.zeros_like(log_pterm[:, :1])], axis=1)
    zeros = xp.zeros_like(log_pterm)
    tokens = xp.where(cols < length[:, None], padded, zeros)
    return xp.where(cols == length[:, None], log_pterm, tokens)


@dataclass(frozen=True)
class RLBatch:
    """One micro-batch of sampled sequences in the action layout (see the module docstring)."""

    log_probs: Array
    old_log_probs: Array
    rewards: Array
    length: Array
    ref_log_probs: Array | None = None
    values: Array | None = None
    old_values: Array | None = None
    entropy: Array | None = None

    def __post_init__(self) -> None:
        try:
            xp = array_namespace(self.rewards, self.length, *self._action_arrays().values())
        except TypeError as exc:
            raise ValueError(
                f"RLBatch: all fields must be arrays of one namespace (numpy or torch): {exc}"
            ) from exc
        if self.log_probs.ndim != 2:
            raise ValueError(
                f"log_probs: expected shape [B, T+1], got {tuple(self.log_probs.shape)}"
            )
        b, a = (int(s) for s in self.log_probs.shape)
        if a < 1:
            raise ValueError("log_probs: need at least one action column (the stop)")
        for name, arr in self._action_arrays().items():
            if tuple(int(s) for s in arr.shape) != (b, a):
                raise ValueError(f"{name}: expected shape [B, T+1] = [{b}, {a}], got {arr.shape}")
            if arr.dtype != self.log_probs.dtype:
                raise ValueError(f"{name}: dtype {arr.dtype} differs from {self.log_probs.dtype}")
        for name in ("rewards", "length"):
            shape = tuple(int(s) for s in getattr(self, name).shape)
            if shape != (b,):
                raise ValueError(f"{name}: expected shape [B] = [{b}], got {shape}")
        if not xp.isdtype(self.log_probs.dtype, "real floating"):
            raise ValueError(
                f"log_probs: expected a real floating dtype, got {self.log_probs.dtype}"
            )
        if not xp.isdtype(self.length.dtype, "integral"):
            raise ValueError(f"length: expected an integer dtype, got {self.length.dtype}")
        if b > 0:
            lo, hi = xp.stack([xp.min(self.length), xp.max(self.length)]).tolist()
            if lo < 0 or hi > a - 1:
                raise ValueError(f"length: values must lie in [0, T={a - 1}], got [{lo}, {hi}]")
        if not bool(xp.all(xp.isfinite(self.rewards))):
            raise ValueError("rewards: every reward must be finite")
        for name, arr in self._action_arrays().items():
            used = xp.where(self.action_mask, arr, xp.zeros_like(arr))
            if not bool(xp.all(xp.isfinite(used))):
                raise ValueError(f"{name}: non-finite value at an action column t <= tau")

    def _action_arrays(self) -> dict[str, Array]:
        return {n: getattr(self, n) for n in _ACTION_FIELDS if getattr(self, n) is not None}

    @property
    def xp(self) -> Any:
        """The array namespace of this batch."""
        return array_namespace(self.log_probs)

    @property
    def batch_size(self) -> int:
        return int(self.log_probs.shape[0])

    @property
    def num_actions(self) -> int:
        """A = T + 1, the number of action columns."""
        return int(self.log_probs.shape[1])

    @cached_property
    def action_mask(self) -> Array:
        """Bool [B, T+1]: column t is an action of the sequence (t <= tau)."""
        cols = self.xp.arange(self.num_actions, device=device(self.length))
        return cols[None, :] <= self.length[:, None]

    def masked(self, arr: Array) -> Array:
        """``arr`` [B, T+1] with the columns after tau set to 0 (keeps garbage out of sums)."""
        return self.xp.where(self.action_mask, arr, self.xp.zeros_like(arr))
