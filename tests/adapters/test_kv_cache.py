"""Decoding passes its KV cache under the name the installed transformers takes: a rollout of the
tiny model (eager and static paths, and a Llama under LoRA) raises no FutureWarning or
DeprecationWarning (transformers 5 warns on every step that passes ``past_key_values``)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from raptb.adapters.lm.kv_cache import cache_keyword
from tests.adapters.test_policy import GRAMMAR, make_policy
from tests.adapters.test_static_decode import llama_lora_policy


@pytest.mark.parametrize(
    ("model", "decode"), [("tiny", "eager"), ("tiny", "static"), ("llama-lora", "eager")]
)
def test_a_rollout_warns_nothing(model: str, decode: str) -> None:
    policy = make_policy(GRAMMAR, seed=3) if model == "tiny" else llama_lora_policy(GRAMMAR)
    policy.decode = decode  # type: ignore[assignment]
    generator = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        rollout = policy.sample(
            ["Make 24:", "1+1"], 2, min_length=1, max_length=6, generator=generator
        )
    assert rollout.tokens.shape == (2, 6)


def test_the_keyword_is_one_the_forward_takes() -> None:
    policy = make_policy(GRAMMAR)
    keyword = cache_keyword(policy.model)
    assert keyword in inspect.signature(policy.model.forward).parameters
    # the name transformers has not deprecated: with both present, the new one
    names = inspect.signature(policy.model.forward).parameters
    assert keyword == ("cache" if "cache" in names else "past_key_values")
