"""Fixtures of the TRL integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of ``trl_fixtures``, saved once per test module."""
    pytest.importorskip("transformers")
    from tests.integrations.trl_fixtures import write_tiny_llama

    folder = tmp_path_factory.mktemp("tiny_llama")
    write_tiny_llama(folder)
    return folder
