"""The RL baselines' sampling temperature, as TRL: defaults per method, rollouts at it, and the
log-probs of the ratio (old, current) and of the reference scored at it, against a float64
transcription of TRL's lines on the same model and sequences."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import PreTrainedModel

import raptb.app.training.rl.rollout as rl_rollout
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.configuration.reference import default_text
from raptb.app.training.step import Trajectories
from raptb.app.training.step_batch import StepBatch
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import RLBatch
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.ppo import PPO
from tests.app.test_train import small_config


def test_default_temperature_is_trl_per_method():
    # TRL 1.12 trl/experimental/ppo/ppo_config.py: PPOConfig.temperature = 0.7;
    # TRL 1.16 trl/trainer/grpo_config.py: GRPOConfig.temperature = 1.0
    assert build_config(overrides={"loss": "ppo"}).rl.temperature == 0.7
    assert build_config(overrides={"loss": "grpo"}).rl.temperature == 1.0
    assert build_config(overrides={"loss": "ppo", "rl.temperature": 1.0}).rl.temperature == 1.0
    assert default_text("rl.temperature") == "1.0; ppo: 0.7"
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match=r"rl\.temperature"):
            build_config(overrides={"loss": "ppo", "rl.temperature": bad})


def _trl_log_probs(
    model: PreTrainedModel, trainer: Trainer, batch: Trajectories, temperature: float
) -> list[torch.Tensor]:
    """Per row, the log-probs of its response (its tokens, then the stop token) as TRL computes
    them, in float64 from the model's logits:

    TRL 1.12 ``PPOTrainer.train`` (trl/experimental/ppo/ppo_trainer.py), the policy's and the
    reference's alike (the old ones are ``generate``'s scores, the logits through transformers'
    temperature warper, i.e. the same division)::

        logits = output.logits[:, context_length - 1 : -1]
        logits /= args.temperature + 1e-7
        new_logprobs = selective_log_softmax(logits, mb_responses)

    TRL 1.16 ``GRPOTrainer._get_per_token_logps_and_entropies`` (trl/trainer/grpo_trainer.py,
    ``selective_log_softmax`` in trl/trainer/utils.py): ``logits = logits / temperature`` then
    the same log-softmax and gather; ``temperature + 1e-7`` below is PPO's, which differs from
    GRPO's ``temperature`` by less than the tolerance of the comparison.
    """
    context = trainer.policy.prompt_ids(batch.prompt)
    out = []
    with torch.no_grad():
        for row, tau in zip(batch.tokens.tolist(), batch.length.tolist(), strict=True):
            response = [*row[:tau], trainer.policy.stop_id]
            query_response = torch.tensor([context + response])
            logits = model(input_ids=query_response).logits[:, len(context) - 1 : -1].double()
            logits /= temperature + 1e-7
            log_probs = torch.log_softmax(logits, dim=-1)
            out.append(log_probs.gather(-1, torch.tensor([response])[..., None])[0, :, 0])
    return out


@pytest.mark.parametrize(
    ("loss", "extra", "temperature"),
    [
        ("ppo", {"rl.num_ppo_epochs": 1}, 0.7),  # TRL's PPO default, kl_coef 0.05: a reference
        ("grpo", {"rl.beta": 0.04, "rl.temperature": 0.5}, 0.5),
    ],
)
def test_rollout_and_log_probs_are_at_the_sampling_temperature(
    tmp_path, monkeypatch, loss, extra, temperature
):
    cfg = small_config(loss=loss, steps=1, **{"optim.grad_accum": 1, **extra})
    trainer = Trainer(cfg, tmp_path, progress=False)
    reference = trainer.policy.reference_copy  # frozen at start-up: the base weights
    assert reference is not None
    with torch.no_grad():  # move the policy off the reference, so that the two differ
        for p in trainer.policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    policy_before = copy.deepcopy(trainer.policy.model)
    rolled: list[StepBatch] = []
    seen: list[RLBatch] = []

    def rolling(*args, **kwargs):
        rolled.append(collect_step(*args, **kwargs))
        return rolled[-1]

    def spying(self, batch, *rest, **options):
        seen.append(batch)
        return call(self, batch, *rest, **options)

    objective = PPO if loss == "ppo" else GRPO
    collect_step, call = rl_rollout.collect_step, objective.__call__
    monkeypatch.setattr(rl_rollout, "collect_step", rolling)
    monkeypatch.setattr(objective, "__call__", spying)
    trainer.train()

    (step,), (scored, *_) = rolled, seen  # the first loss call precedes every optimizer step
    (batch,) = step.pieces  # one prompt, every row sampled
    assert set(step.plan.temperature.tolist()) == {temperature}  # each row sampled at T
    assert batch.temperature == pytest.approx(temperature, rel=1e-12)
    policy = _trl_log_probs(policy_before, trainer, batch, temperature)
    ref = _trl_log_probs(reference, trainer, batch, temperature)
    assert scored.ref_log_probs is not None
    for b, tau in enumerate(batch.length.tolist()):
        for mine, trl in (
            (scored.log_probs, policy),
            (scored.old_log_probs, policy),
            (scored.ref_log_probs, ref),
        ):
            torch.testing.assert_close(mine[b, : tau + 1].double(), trl[b], rtol=0, atol=2e-5)
    # the reference differs from the policy, and the temperature matters at these logits
    untempered = _trl_log_probs(policy_before, trainer, batch, 1.0)
    assert max(float((p - r).abs().max()) for p, r in zip(policy, ref, strict=True)) > 1e-2
    assert max(float((p - u).abs().max()) for p, u in zip(policy, untempered, strict=True)) > 1e-2
