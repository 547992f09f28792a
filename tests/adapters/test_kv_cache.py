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


class _Forward(torch.nn.Module):
    """A module whose forward takes the given keyword names (and nothing else of interest)."""

    def __init__(self, *names: str) -> None:
        super().__init__()
        params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names]
        self.forward = lambda **kwargs: None  # type: ignore[method-assign]
        self.forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]


class _Wrapper(torch.nn.Module):
    """A PEFT-like wrapper whose own forward takes anything (``**kwargs``)."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, *args, **kwargs):
        return self.base(*args, **kwargs)

    def get_base_model(self) -> torch.nn.Module:
        return self.base


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("input_ids", "cache"), "cache"),  # transformers 5
        (("input_ids", "past_key_values"), "past_key_values"),  # transformers 4
        (("input_ids", "past_key_values", "cache"), "cache"),  # both: the new name
    ],
)
def test_the_keyword_is_the_one_the_base_models_forward_takes(names, expected) -> None:
    model = _Forward(*names)
    assert cache_keyword(model) == expected
    assert cache_keyword(_Wrapper(model)) == expected  # read from the base, not the wrapper


def test_the_installed_transformers_tiny_model_takes_its_keyword() -> None:
    policy = make_policy(GRAMMAR)
    assert cache_keyword(policy.model) in inspect.signature(policy.model.forward).parameters
