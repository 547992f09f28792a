"""A completion's reward from TRL's reward functions, with TRL's semantics for None and NaN.

TRL 1.16.0 (``trl/trainer/grpo_trainer.py``): ``GRPOTrainer._calculate_rewards`` turns a reward
function's ``None`` into NaN (a NaN it returns stays NaN), one column per function, gathered over
processes; ``_generate_and_score_completions`` sums the columns with ``reward_weights`` skipping
NaN (``nansum``), and marks a completion for which *every* function gave NaN unscorable: its
reward is NaN and its advantage is forced to 0, so it carries no learning signal. A completion
some function scored takes the weighted sum of those that did.

GFlowNetTrainer follows it: S (the task reward at the stop) is that weighted sum; an unscorable
completion has no log-reward, so it is left out of the loss (it trains nothing) and never enters
the replay buffer. An infinite reward (or weighted sum) has no log-reward either, and TRL has no
rule for it: it stops the run with one line naming the reward function and the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def summed_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[B] the weighted sum over reward functions of ``rewards_per_func`` [B, F] (NaN where a
    function gave None), skipping NaN; NaN where every function gave NaN (unscorable)."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    summed = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    return summed.masked_fill(unscorable, torch.nan)


def check_finite_rewards(
    rewards_per_func: torch.Tensor,
    summed: torch.Tensor,
    names: Sequence[str],
    local: slice,
    prompts: Sequence[object],
    completions: Sequence[object],
) -> None:
    """ValueError (one line) at the first infinite reward of the generation batch
    ``rewards_per_func`` [B, F] (or infinite weighted sum ``summed`` [B]), naming the function and
    the row; ``local`` is this process's rows, whose ``prompts`` and ``completions`` it quotes."""
    bad = torch.isinf(rewards_per_func)
    culprit = None
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        value = float(rewards_per_func[row, column])
        culprit = f"reward function {names[column]!r} returned {value}"
    elif bool(torch.isinf(summed).any()):
        row = int(torch.isinf(summed).nonzero()[0, 0])
        culprit = f"the weighted sum of the rewards (reward_weights) is {float(summed[row])}"
    if culprit is None:
        return
    where = f"row {row} of the generation batch"
    if local.start <= row < local.stop:
        i = row - local.start
        where += f" (prompt {_short(prompts[i])}, completion {_short(completions[i])})"
    raise ValueError(
        f"GFlowNetTrainer: {culprit} for {where}; a reward must be finite, or None when the "
        "completion cannot be scored"
    )


def _short(value: object, width: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= width else text[: width - 3] + "..."
