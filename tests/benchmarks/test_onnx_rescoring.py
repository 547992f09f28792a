"""benchmarks/onnx_rescoring.py's graphs compute the rescoring and its gradient.

The benchmark's finding (the rescoring is slower in ONNX Runtime than in torch on the CPU,
benchmarks/step_speed.md) stands only if its graphs compute the same thing: the main job's
log-probabilities and every parameter's gradient, against torch's autograd through
``lean_gpt2.shared_prompt_logits`` and ``token_log_probs`` (the trainer's own rescoring), on the
embedded model moved off its initialisation, for each activation the graphs write a derivative
for and a temperature other than 1.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 2e-5
"""Float32 rounding of two engines' kernels: the differences seen are below 2e-6 (log-probs of
magnitude 1-20, gradients relative to each parameter's largest entry)."""


@pytest.fixture(scope="module")
def rescoring():
    pytest.importorskip("onnx")  # (the bench extra)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # (its onnx_builder)
    spec = importlib.util.spec_from_file_location(
        "onnx_rescoring", ROOT / "benchmarks" / "onnx_rescoring.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["onnx_rescoring"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("act", "temperature"),
    [("gelu_pytorch_tanh", 1.0), ("gelu_pytorch_tanh", 0.7), ("gelu", 1.0), ("relu", 1.0),
     ("silu", 1.0)],
)  # fmt: skip
def test_graphs_match_autograd(rescoring, act: str, temperature: float) -> None:
    found = rescoring.check(rows=6, width=4, temperature=temperature, act=act)
    assert len(found) == 29  # the log-probabilities and the model's 28 parameters
    worst = max(found, key=found.get)
    assert found[worst] < TOLERANCE, f"{worst}: {found[worst]:.2e}"
