"""The TRL versions this integration is tested with, and the TRL internals it relies on.

``GFlowNetTrainer`` subclasses TRL's ``GRPOTrainer`` and overrides or calls the private methods
and attributes below, whose signatures and behaviour were read from TRL 1.16.0. They may change in
any TRL release, so the integration refuses another version with a one-line error
(``check_trl_version``) until it has been tested against it.
"""

from __future__ import annotations

import inspect
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.version import Version

TESTED_TRL = (Version("1.16"), Version("1.17"))
"""[low, high): the TRL releases the tests pass with (the ``trl`` extra pins the same range);
development and pre-release builds of a release outside it are refused too."""

TRL_VERSION_READ = "1.16.0"
"""The TRL release whose source the overridden internals were read from."""

OVERRIDDEN_TRL_INTERNALS = (
    "GRPOTrainer._generate_and_score_completions (wrapped: replay splice, rewards, reference)",
    "GRPOTrainer._calculate_rewards (wrapped: keeps the summed reward of each completion, NaN "
    "when unscorable as TRL marks it, and refuses an infinite one)",
    "GRPOTrainer._compute_loss (replaced: the GFlowNet objective)",
    "GRPOTrainer._save_checkpoint (extended: logZ, replay buffer and sampler state)",
    "GRPOTrainer._load_optimizer_and_scheduler (extended: restores them on resume)",
    "Trainer.save_model (extended: logZ beside the saved model)",
    "Trainer.create_optimizer (extended: logZ's own parameter group)",
    "GRPOTrainer.log (wrapped: the completions table written by completions_table, its "
    "._logs rows rewritten after generation; reads .log_completions, .num_completions_to_print, "
    ".log_unique_prompts)",
    "GRPOTrainer._name, ._paper (replaced: what create_model_card credits and cites)",
    "Trainer._get_output_dir (called: the checkpoint folder)",
    "GRPOTrainer.eos_token_ids, .ref_model, .reward_weights, .reward_func_names, "
    ".max_completion_length, ._metrics, "
    "._tokenizer, ._is_vlm, .beta, and Trainer.current_gradient_accumulation_steps (read; .beta "
    "set to 0 after construction)",
    "trl.trainer.utils.use_adapter (called: the PEFT reference)",
)
"""The private TRL methods and attributes this integration overrides or reads."""


def check_trl_version() -> str:
    """The installed TRL version; ImportError (one line) when TRL is missing or untested."""
    try:
        installed = version("trl")
    except PackageNotFoundError:
        raise ImportError("raptb.integrations.trl needs TRL: pip install 'raptb[trl]'") from None
    low, high = TESTED_TRL
    found = Version(installed)
    # a development or pre-release build counts as the release it leads to (1.17.0.dev0 is a TRL
    # after 1.16, though it sorts below 1.17); one before ``low`` (1.16.0rc1) sorts below it
    if not (low <= found and Version(found.base_version) < high):
        raise ImportError(
            f"raptb.integrations.trl is tested with trl>={low},<{high}, found trl {installed}: "
            f"pip install 'raptb[trl]'"
        )
    return installed


OVERRIDDEN_SIGNATURES = {
    "_generate_and_score_completions": "(self, inputs)",
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_compute_loss": "(self, model, inputs)",
    "_save_checkpoint": "(self, model, trial)",
    "_load_optimizer_and_scheduler": "(self, checkpoint)",
    "create_optimizer": "(self, model=None)",
    "log": "(self, logs, start_time=None)",
    "_get_output_dir": "(self, trial)",
    "save_model": "(self, output_dir=None, _internal_call=False)",
}
"""The ``GRPOTrainer`` methods GFlowNetTrainer overrides or calls, with their parameters (names,
kinds and defaults; annotations left out) as read in TRL ``TRL_VERSION_READ``."""


def bare_signature(function: Any) -> str:
    """``function``'s parameters without annotations: ``(self, model=None)``."""
    signature = inspect.signature(function)
    parameters = [
        p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()
    ]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def check_trl_internals(trainer_class: Any) -> None:
    """ImportError (one line naming the method) when a method of ``OVERRIDDEN_SIGNATURES`` is
    missing from ``trainer_class`` (TRL's ``GRPOTrainer``) or its parameters changed: a TRL
    upgrade that rewrote what GFlowNetTrainer overrides is caught at import, not mid-run."""
    for name, read in OVERRIDDEN_SIGNATURES.items():
        method = getattr(trainer_class, name, None)
        if method is None:
            raise ImportError(
                f"raptb.integrations.trl: GRPOTrainer.{name} is gone from this TRL; "
                f"GFlowNetTrainer overrides it as read in TRL {TRL_VERSION_READ}"
            )
        found = bare_signature(method)
        if found != read:
            raise ImportError(
                f"raptb.integrations.trl: GRPOTrainer.{name} is now {name}{found}, read as "
                f"{name}{read} in TRL {TRL_VERSION_READ}; GFlowNetTrainer overrides it"
            )
