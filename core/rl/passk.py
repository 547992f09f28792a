"""Pass@k training (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
Exploitation of Large Reasoning Models", https://arxiv.org/abs/2508.10751): GRPO's loss with the
closed-form ("analytical") advantages of the pass@k reward, ``--loss passk``.

For a group of n samples of one prompt, c of them correct, the group's pass@k reward over the
C(n, k) k-subsets has mean and standard deviation

    rho   = 1 - C(n - c, k) / C(n, k),            sigma = sqrt(rho (1 - rho))

and each sample's advantage is the mean over the k-subsets holding it of the subset's normalised
reward, in closed form:

    A_correct   = (1 - rho) / (sigma + 1e-6)
    A_incorrect = (1 - rho - C(n - c - 1, k - 1) / C(n - 1, k - 1)) / (sigma + 1e-6)

with C(a, b) = 0 when a < 0 or b > a (SciPy's ``comb``). Transcribed from the authors'
``calc_adv`` (RUCAIBox/Passk_Training, ``code/passk_adv.py``, commit c3ba575): a group whose
samples are all correct or all wrong, or whose pass@k is certain (c > n - k), gets advantage 0
everywhere. A row is correct when its terminal reward is > 0 (the authors' reward is 0/1; raptb's
task reward is lambda S, with S in {0, 1} on Expr24). The policy loss is GRPO's
(``core.rl.grpo``, TRL's loss types and names) on these advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from array_api_compat import array_namespace, device

from raptb.core.rl.grpo import GRPO

Array = Any
# the authors' constant added to sigma
PASSK_STD_EPS = 1e-6


def _comb(a: int, b: int) -> int:
    """C(a, b), 0 where a < 0, b < 0 or b > a (SciPy ``comb``'s value there)."""
    return math.comb(a, b) if 0 <= b <= a else 0


def passk_group_advantages(num_correct: int, n: int, k: int) -> tuple[float, float, float]:
    """(A_correct, A_incorrect, sigma) of a group of ``n`` samples with ``num_correct`` correct."""
    c = num_correct
    rho = 1.0 - _comb(n - c, k) / _comb(n, k)
    sigma = math.sqrt(rho * (1.0 - rho))
    a_pos = (1.0 - rho) / (sigma + PASSK_STD_EPS)
    a_neg = (1.0 - rho - _comb(n - c - 1, k - 1) / _comb(n - 1, k - 1)) / (sigma + PASSK_STD_EPS)
    return a_pos, a_neg, sigma


def passk_advantages(rewards: Array, num_generations: int, k: int) -> tuple[Array, Array]:
    """Pass@k advantages [B] and each row's group sigma [B] (0 for a zero-variance group).

    ``rewards`` [B] holds B / num_generations consecutive groups; a row is correct when its
    reward is > 0.
    """
    xp = array_namespace(rewards)
    b = int(rewards.shape[0])
    n = num_generations
    if b % n:
        raise ValueError(
            f"num_generations: the batch of {b} rows must hold whole groups of "
            f"num_generations = {n} samples"
        )
    if not 1 <= k <= n:
        raise ValueError(f"pass_k: must lie in [1, num_generations = {n}], got {k}")
    correct = xp.reshape(rewards > 0, (b // n, n))
    counts = xp.sum(xp.astype(correct, xp.int64), axis=1).tolist()
    table = [passk_group_advantages(int(c), n, k) for c in counts]
    pos = xp.asarray([t[0] for t in table], dtype=rewards.dtype, device=device(rewards))
    neg = xp.asarray([t[1] for t in table], dtype=rewards.dtype, device=device(rewards))
    sigma = xp.asarray([t[2] for t in table], dtype=rewards.dtype, device=device(rewards))
    adv = xp.where(correct, pos[:, None], neg[:, None])
    return xp.reshape(adv, (b,)), xp.reshape(sigma[:, None] * xp.ones_like(adv), (b,))


@dataclass(frozen=True)
class PassK(GRPO):
    """GRPO with Pass@k training's closed-form advantages (``pass_k``: the k of pass@k, <=
    num_generations; default 4, the default of UCPO's code's pass@k estimator: the authors'
    function takes k without a default). GRPO's other fields are its loss's (TRL's)."""

    name: ClassVar[str] = "passk"
    pass_k: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self.pass_k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.num_generations:
            raise ValueError(
                f"pass_k: must be an integer in [1, num_generations = {self.num_generations}], "
                f"got {k!r}"
            )

    def advantages(
        self, rewards: Array, sequence_log_probs: Array | None = None, lengths: Array | None = None
    ) -> tuple[Array, Array]:
        """Pass@k advantages of ``rewards`` [B] (whole groups) and each row's group sigma."""
        return passk_advantages(rewards, self.num_generations, self.pass_k)
