"""The prefix-batch layout shared by every objective.

B trajectories of at most T generated tokens. Prefix state k = 0..T is the prompt plus the first k
generated tokens; tau_b (``length``) is the number of tokens generated before the stop action.

    log_pf     [B, T]    column t = log P_F(s_{t+1} | s_{0:t}) for t < tau, 0 after (masked)
    log_pterm  [B, T+1]  column k = log P_F(stop | s_{0:k}) for k <= tau, 0 after
    log_r      [B, T+1]  column k = log R(s_{0:k} + stop) = kappa log P_ref + u_k, for k <= tau
    u          [B, T+1]  column k = task-only reward u_k = lambda S(s_{0:k} + stop), for k <= tau
    length     [B]       tau_b, an integer in [0, T]

Arrays may be numpy or torch (any namespace supported by ``array-api-compat``); all of a batch's
arrays must come from the same namespace. Values at masked positions are never read by the
objectives, but they must still be finite where used (k <= tau, t < tau).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from array_api_compat import array_namespace, device

Array = Any

_FLOAT_FIELDS = ("log_pf", "log_pterm", "log_r", "u")


@dataclass(frozen=True)
class PrefixBatch:
    """One batch of terminated trajectories in the prefix layout (see the module docstring)."""

    log_pf: Array
    log_pterm: Array
    log_r: Array
    u: Array
    length: Array

    def __post_init__(self) -> None:
        try:
            xp = array_namespace(self.log_pf, self.log_pterm, self.log_r, self.u, self.length)
        except TypeError as exc:
            raise ValueError(
                f"PrefixBatch: all fields must be arrays of one namespace (numpy or torch): {exc}"
            ) from exc
        if self.log_pf.ndim != 2:
            raise ValueError(f"log_pf: expected shape [B, T], got {tuple(self.log_pf.shape)}")
        b, t = (int(s) for s in self.log_pf.shape)
        for name in _FLOAT_FIELDS[1:]:
            shape = tuple(int(s) for s in getattr(self, name).shape)
            if shape != (b, t + 1):
                raise ValueError(f"{name}: expected shape [B, T+1] = [{b}, {t + 1}], got {shape}")
        if tuple(int(s) for s in self.length.shape) != (b,):
            raise ValueError(f"length: expected shape [B] = [{b}], got {tuple(self.length.shape)}")
        dtype = self.log_pf.dtype
        if not xp.isdtype(dtype, "real floating"):
            raise ValueError(f"log_pf: expected a real floating dtype, got {dtype}")
        for name in _FLOAT_FIELDS[1:]:
            if getattr(self, name).dtype != dtype:
                raise ValueError(
                    f"{name}: dtype {getattr(self, name).dtype} differs from log_pf's {dtype}"
                )
        if not xp.isdtype(self.length.dtype, "integral"):
            raise ValueError(f"length: expected an integer dtype, got {self.length.dtype}")
        if b > 0:
            lo, hi = xp.stack([xp.min(self.length), xp.max(self.length)]).tolist()
            if lo < 0 or hi > t:
                raise ValueError(f"length: values must lie in [0, T={t}], got min {lo}, max {hi}")
        # One reduction (one device sync) in the common case: a NaN or inf anywhere in the used
        # positions makes the sum non-finite. Only then look for the field to name.
        used = [
            xp.sum(xp.where(mask, arr, xp.zeros_like(arr)))
            for arr, mask in (
                (self.log_pf, self.token_mask),
                (self.log_pterm, self.prefix_mask),
                (self.log_r, self.prefix_mask),
                (self.u, self.prefix_mask),
            )
        ]
        if not bool(xp.all(xp.isfinite(xp.stack(used)))):
            for name, mask in (
                ("log_pf", self.token_mask),
                ("log_pterm", self.prefix_mask),
                ("log_r", self.prefix_mask),
                ("u", self.prefix_mask),
            ):
                arr = getattr(self, name)
                if not bool(xp.all(xp.isfinite(xp.where(mask, arr, xp.zeros_like(arr))))):
                    raise ValueError(f"{name}: non-finite value at a position the objectives use")
            raise ValueError("PrefixBatch: values too large (the sum of used positions overflows)")

    @property
    def xp(self) -> Any:
        """The array namespace of this batch."""
        return array_namespace(self.log_pf)

    @property
    def batch_size(self) -> int:
        return int(self.log_pf.shape[0])

    @property
    def max_length(self) -> int:
        """T, the number of token columns."""
        return int(self.log_pf.shape[1])

    @cached_property
    def token_mask(self) -> Array:
        """Bool [B, T]: column t holds a generated token (t < tau)."""
        xp = self.xp
        cols = xp.arange(self.max_length, device=device(self.length))
        return cols[None, :] < self.length[:, None]

    @cached_property
    def prefix_mask(self) -> Array:
        """Bool [B, T+1]: prefix k was visited (k <= tau)."""
        xp = self.xp
        cols = xp.arange(self.max_length + 1, device=device(self.length))
        return cols[None, :] <= self.length[:, None]
