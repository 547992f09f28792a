"""Whether the static rollout is the eager one, and where they part, whether float rounding alone
explains it.

Both paths draw column k's tokens as ``argmax_c (z_c / t - log q_c)`` over the allowed
sub-vocabulary, with the logits z of the row's prefix, its temperature t and the same noise
q ~ Exp(1) (``static_decode``'s docstring): given equal logits they draw equal tokens. Their
logits differ by float rounding (another order of summation: a static cache attends over all its
positions, masked, where the eager cache holds only those written; a bucket has more rows), so a
draw flips where the two candidates' perturbed scores lie closer than the logits' difference
moves them: each path's margin for its own draw, ``s(c_own) - s(c_other)``, is >= 0, and the two
margins add up to ``(dz(c_eager) - dz(c_static)) / t``, at most twice the logits' difference
over t. Whether that difference is rounding is asked of an independent reference: the model in
float64, each row's prompt and tokens in one plain forward (no cache, no padding). A genuine
difference (a wrong position, mask or cache entry) puts the static path far from it; rounding
puts it about as near as the eager path is.

``compare_rollouts`` checks, in the columns before the first that parts (all of them where none
does), the recorded log-probabilities; when they are not within ``TOLERANCE`` or a row parts,
both paths' distances to the reference; and at the first parting, both paths' logits (each
recomputed by its own forwards: ``rollout.eager_logits``, ``static_decode.static_logits``), the
noise (the generator's draws replayed) and the margins. The verdict is ``identical`` (the same
rows, log-probs within ``TOLERANCE``), ``rounding`` (the static path no farther from the
reference than ``ROUNDING_FACTOR`` times the eager path, or than ``TOLERANCE``, in log-probs and,
at a parting, in logits; and each path's draw there its own logits' winner) or ``genuine``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from raptb.adapters.lm.gpu.static_decode import static_logits
from raptb.adapters.lm.rollout import RolloutPolicy, eager_logits
from raptb.adapters.lm.rollout_record import Rollout

TOLERANCE = 1e-5
"""Log-probabilities (and logits) within this are the same: float32 rounding of a small model."""
ROUNDING_FACTOR = 4.0
"""How much farther from the float64 reference than the eager path rounding may put the static."""
REFERENCE_ROWS = 16
"""Rows of one reference forward (bounds its float64 logits [rows, P + T, V])."""

Verdict = Literal["identical", "rounding", "genuine"]


@dataclass(frozen=True)
class Parting:
    """The first column where a row's tokens differ: row, column, the sub-vocabulary index each
    path drew (L is stop), the largest |logit difference| between the paths over the
    sub-vocabulary (the legal tokens and stop), each path's margin for its own draw over the
    other's, the float64 reference's margin (eager's candidate over static's; either sign) and
    each path's largest |logit - reference| over the whole vocabulary."""

    row: int
    column: int
    eager_choice: int
    static_choice: int
    logits_difference: float
    eager_margin: float
    static_margin: float
    reference_margin: float
    eager_logit_error: float
    static_logit_error: float


@dataclass(frozen=True)
class Agreement:
    """``compare_rollouts``'s answer (module docstring); the errors are None where the verdict
    needed no reference."""

    verdict: Verdict
    same_rows: bool
    log_prob_difference: float
    eager_error: float | None
    static_error: float | None
    parting: Parting | None

    def describe(self) -> str:
        """One line: the verdict and its numbers."""
        text = f"{self.verdict}: max |log-prob difference| {self.log_prob_difference:.2e}"
        if self.eager_error is not None:
            text += (
                f", from the float64 reference eager {self.eager_error:.2e}, "
                f"static {self.static_error:.2e}"
            )
        if (p := self.parting) is not None:
            text += (
                f"; row {p.row} parts at column {p.column} (eager draws {p.eager_choice}, static "
                f"{p.static_choice}): logits differ by {p.logits_difference:.2e}, margins eager "
                f"{p.eager_margin:.2e}, static {p.static_margin:.2e}, reference "
                f"{p.reference_margin:+.2e}; logits from the reference eager "
                f"{p.eager_logit_error:.2e}, static {p.static_logit_error:.2e}"
            )
        return text


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference model: a float64 copy of ``model`` in eval mode."""
    return copy.deepcopy(model).double().eval()


@torch.no_grad()
def compare_rollouts(
    policy: RolloutPolicy,
    reference: torch.nn.Module,
    prompt_rows: Sequence[Sequence[int]],
    eager: Rollout,
    static: Rollout,
    *,
    generator: torch.Generator,
    temperature: torch.Tensor,
    always_reference: bool = False,
) -> Agreement:
    """The agreement of an eager and a static rollout of the same arguments (module docstring).

    reference: ``float64_copy(policy.model)``. prompt_rows: each row's prompt ids.
    generator: a generator in the state the rollouts started from (its draws are replayed to
    find the noise of the parting column). temperature: float32 [n], each row's.
    always_reference: measure both paths' distances to the reference even when the rollouts are
    identical (tests; the verdict is the same).
    """
    eager, static = _on_cpu(eager), _on_cpu(static)
    big_t = eager.tokens.shape[1]
    column = _first_parting_column(eager, static)
    pf_cols = torch.arange(big_t)[None, :] < min(column, big_t)
    pterm_cols = torch.arange(big_t + 1)[None, :] <= column
    recorded = _recorded(eager, pf_cols, pterm_cols)
    difference = _max_abs(_values(eager, recorded) - _values(static, recorded))
    same_rows = column > big_t
    if same_rows and difference <= TOLERANCE and not always_reference:
        return Agreement("identical", True, difference, None, None, None)
    ref_pf, ref_pterm, ref_logits = _reference(
        reference, prompt_rows, eager, policy.stop_id, None if same_rows else column
    )
    ref_values = torch.cat([ref_pf[recorded[0]], ref_pterm[recorded[1]]])
    eager_error = _max_abs(_values(eager, recorded).double() - ref_values)
    static_error = _max_abs(_values(static, recorded).double() - ref_values)
    close = _within_rounding(static_error, eager_error)
    parting = None
    if not same_rows:
        assert ref_logits is not None
        parting = _parting(
            policy, prompt_rows, eager, static, column, ref_logits, generator, temperature
        )
        close = (
            close
            and _within_rounding(parting.static_logit_error, parting.eager_logit_error)
            # each path drew what its own logits and the noise make the winner (a path that
            # drew otherwise has a wrong draw, whatever its logits)
            and min(parting.eager_margin, parting.static_margin) >= -TOLERANCE
        )
    verdict: Verdict = "rounding" if close else "genuine"
    if same_rows and difference <= TOLERANCE:
        verdict = "identical"
    return Agreement(verdict, same_rows, difference, eager_error, static_error, parting)


def _on_cpu(rollout: Rollout) -> Rollout:
    return replace(
        rollout,
        tokens=rollout.tokens.cpu(),
        length=rollout.length.cpu(),
        log_pf=rollout.log_pf.cpu(),
        log_pterm=rollout.log_pterm.cpu(),
    )


def _within_rounding(static_error: float, eager_error: float) -> bool:
    return static_error <= max(ROUNDING_FACTOR * eager_error, TOLERANCE)


def _first_parting_column(a: Rollout, b: Rollout) -> int:
    """The first column k where some row's action differs (a token, or stop against a token);
    T + 1 where none does."""
    big_t = a.tokens.shape[1]
    for k in range(big_t + 1):
        live = (a.length >= k) & (b.length >= k)
        stop_a, stop_b = a.length == k, b.length == k
        differs = stop_a != stop_b
        if k < big_t:
            differs |= a.tokens[:, k] != b.tokens[:, k]
        if bool((differs & live).any()):
            return k
    return big_t + 1


def _recorded(
    rollout: Rollout, pf_cols: torch.Tensor, pterm_cols: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool masks of the entries both rollouts record alike: log_pf before the stop, log_pterm
    up to it, within the columns given."""
    big_t = rollout.tokens.shape[1]
    length = rollout.length[:, None]
    return (
        (torch.arange(big_t)[None, :] < length) & pf_cols,
        (torch.arange(big_t + 1)[None, :] <= length) & pterm_cols,
    )


def _values(rollout: Rollout, recorded: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.cat([rollout.log_pf[recorded[0]], rollout.log_pterm[recorded[1]]])


def _max_abs(values: torch.Tensor) -> float:
    return float(values.abs().max()) if values.numel() else 0.0


def _reference(
    reference: torch.nn.Module,
    prompt_rows: Sequence[Sequence[int]],
    rollout: Rollout,
    stop_id: int,
    column: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Float64 log_pf [n, T] and log_pterm [n, T + 1] of the rollout's tokens (pad after a stop
    is harmless: a causal model's earlier positions do not see it), rows sharing a prompt
    forwarded together without padding; and, with ``column``, the logits [n, V] there."""
    n, big_t = rollout.tokens.shape
    log_pf = torch.zeros(n, big_t, dtype=torch.float64)
    log_pterm = torch.zeros(n, big_t + 1, dtype=torch.float64)
    at_column = None
    device = next(reference.parameters()).device
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, ids in enumerate(prompt_rows):
        groups.setdefault(tuple(ids), []).append(row)
    for prompt, all_rows in groups.items():
        for start in range(0, len(all_rows), REFERENCE_ROWS):
            rows = all_rows[start : start + REFERENCE_ROWS]
            body = rollout.tokens[rows]
            ids = torch.cat([torch.tensor(prompt).expand(len(rows), -1), body], dim=1)
            logits = reference(input_ids=ids.to(device)).logits[:, len(prompt) - 1 :].cpu()
            log_probs = torch.log_softmax(logits.double(), dim=-1)
            log_pf[rows] = log_probs[:, :big_t].gather(2, body[:, :, None]).squeeze(2)
            log_pterm[rows] = log_probs[:, :, stop_id]
            if column is not None:
                if at_column is None:
                    at_column = torch.zeros(n, logits.shape[-1], dtype=torch.float64)
                at_column[rows] = logits[:, column].double()
    return log_pf, log_pterm, at_column


def _parting(
    policy: RolloutPolicy,
    prompt_rows: Sequence[Sequence[int]],
    eager: Rollout,
    static: Rollout,
    column: int,
    reference_logits: torch.Tensor,
    generator: torch.Generator,
    temperature: torch.Tensor,
) -> Parting:
    """``Parting`` at ``column``, the first where a row's tokens differ (its first such row)."""
    n, big_t = eager.tokens.shape
    sub_ids = torch.tensor([*policy.legal_ids, policy.stop_id])
    num_legal = len(policy.legal_ids)
    choice = {
        name: torch.where(
            rollout.length == column,
            num_legal,
            _sub_index(rollout.tokens[:, min(column, big_t - 1)], sub_ids),
        )
        for name, rollout in (("eager", eager), ("static", static))
    }
    live = (eager.length >= column) & (static.length >= column)
    row = int(((choice["eager"] != choice["static"]) & live).nonzero()[0, 0])
    prefix = eager.tokens[:, :column]
    logits = {
        "eager": eager_logits(policy, prompt_rows, prefix)[row].cpu().double(),
        "static": static_logits(policy, prompt_rows, prefix, big_t)[row].cpu().double(),
    }
    for _ in range(column + 1):  # each column draws q [n, L + 1] (static_decode's docstring)
        noise = torch.empty(n, num_legal + 1, device=generator.device)
        noise.exponential_(1, generator=generator)
    log_q, temp = noise[row].cpu().double().log(), float(temperature[row].cpu())
    pair = [int(choice["eager"][row]), int(choice["static"][row])]

    def margin(z: torch.Tensor) -> float:
        """The perturbed score of eager's candidate over static's under logits z [V]."""
        scores = z[sub_ids[pair]] / temp - log_q[pair]
        return float(scores[0] - scores[1])

    ref_at = reference_logits[row]
    return Parting(
        row=row,
        column=column,
        eager_choice=pair[0],
        static_choice=pair[1],
        logits_difference=_max_abs((logits["eager"] - logits["static"])[sub_ids]),
        eager_margin=margin(logits["eager"]),
        static_margin=-margin(logits["static"]),
        reference_margin=margin(ref_at),
        eager_logit_error=_max_abs(logits["eager"] - ref_at),
        static_logit_error=_max_abs(logits["static"] - ref_at),
    )


def _sub_index(tokens: torch.Tensor, sub_ids: torch.Tensor) -> torch.Tensor:
    """Each token's index in ``sub_ids`` (pad, not among them, maps to -1)."""
    hits = tokens[:, None] == sub_ids[None, :]
    return torch.where(hits.any(dim=1), hits.int().argmax(dim=1), -1)
