"""The KV-cache keyword of a causal LM's forward, so that decoding passes its Cache object under
the name the installed transformers takes.

transformers 5 renamed the forward's ``past_key_values`` argument (and the output field) to
``cache``, and warns (FutureWarning) on every call that still uses the old name; the releases
raptb supports before it (``transformers>=4.45``) take only ``past_key_values``. The name is read
from the model's own forward signature (under a PEFT wrapper, the base model's).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

NEW_NAME, OLD_NAME = "cache", "past_key_values"


def cache_keyword(model: torch.nn.Module) -> str:
    """``"cache"`` when ``model``'s forward takes it, else ``"past_key_values"``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(base.forward).parameters
    return NEW_NAME if NEW_NAME in parameters else OLD_NAME


def returned_cache(output: Any, keyword: str) -> Any:
    """The Cache object a forward with ``use_cache=True`` returned, read under ``keyword``."""
    return getattr(output, keyword)
