"""Adaptive entropy control of GRPO's entropy bonus (Skywork-OR1, He et al. 2025,
https://arxiv.org/abs/2505.22312), as TRL's ``GRPOTrainer`` runs it (``use_adaptive_entropy``).

The loss subtracts c_applied * H, H the mean per-action entropy of the policy. The controller
holds the coefficient c and the entropy H_last measured over the previous optimizer step (every
micro-batch, every process: sum of entropies over sum of actions; +inf before the first step):

    c_applied = c if H_last <= entropy_target else 0          (the same for a whole step)
    after the step, with its H:  c <- min(c + delta, c_max) if H <= entropy_target
                                 c <- max(c - delta, c_min) otherwise;   H_last <- H

Transcribed from huggingface/trl ``trl/trainer/grpo_trainer.py`` (``_compute_loss``, commit
f2cd577), names and defaults of its ``GRPOConfig``: ``entropy_coef`` (the initial c),
``entropy_coef_min`` 0, ``entropy_coef_max`` 1, ``entropy_coef_delta`` 0.005,
``entropy_target`` 0.2 nats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AdaptiveEntropy:
    """The controller's state: ``coef`` (c) and ``last_entropy`` (H_last), see the module."""

    coef: float
    entropy_target: float
    entropy_coef_delta: float
    entropy_coef_min: float
    entropy_coef_max: float
    last_entropy: float = math.inf

    @property
    def applied(self) -> float:
        """The coefficient this step's loss applies."""
        return self.coef if self.last_entropy <= self.entropy_target else 0.0

    def update(self, entropy: float) -> None:
        """Move c by one delta toward the target, after a step whose mean entropy is ``entropy``."""
        if entropy <= self.entropy_target:
            self.coef = min(self.coef + self.entropy_coef_delta, self.entropy_coef_max)
        else:
            self.coef = max(self.coef - self.entropy_coef_delta, self.entropy_coef_min)
        self.last_entropy = entropy
