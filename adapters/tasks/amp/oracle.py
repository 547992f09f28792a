"""AMP oracles: a batched function from peptides to antimicrobial probabilities.

An oracle is any callable ``f(sequences: list[str]) -> list[float]`` (one probability in [0, 1]
per sequence), named on the command line as ``module:function``. :class:`CheckedOracle` validates
every answer (length, finiteness, range) with an error naming the function, and calls it once per
batch on the distinct sequences it has not seen (results are cached).

Default: Macrel's AMP classifier (Santos-Junior et al. 2020, MIT): a random forest shipped as an
ONNX model inside the ``macrel`` wheel, on 22 physico-chemical features that Macrel computes in
Python; it runs offline (``pip install 'raptb[amp]'``). Sequences are normalised as ``macrel
peptides`` does (a leading M, the start codon, is dropped) so the numbers match its output.
The paper's oracle (an MLP on ProtAlbert embeddings) was never released.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from raptb.adapters.tasks.dotted_path import load_dotted

Oracle = Callable[[list[str]], Sequence[float]]
MACREL_ORACLE = "raptb.adapters.tasks.amp.oracle:macrel_amp_probability"
FORMER_MACREL_ORACLE = "raptb.adapters.amp_oracle:macrel_amp_probability"
"""The default oracle's path before AMP had its folder, which earlier runs saved."""
MACREL_MISSING = (
    "amp.oracle: the default oracle needs Macrel; install it with pip install 'raptb[amp]' "
    "or name your own with --oracle module:function"
)
# Cached oracle answers are dropped past this many sequences (a long run meets millions).
ORACLE_CACHE_LIMIT = 500_000


def load_oracle(path: str) -> Oracle:
    """Import the oracle ``package.module:function`` (ValueError naming ``amp.oracle``)."""
    return load_dotted(path, "amp.oracle")


class CheckedOracle:
    """An oracle with validated, cached, batched calls (one call per batch of new sequences)."""

    def __init__(self, oracle: Oracle, name: str) -> None:
        self.oracle = oracle
        self.name = name
        self._cache: dict[str, float] = {}

    def __call__(self, sequences: Sequence[str]) -> list[float]:
        """Probabilities for ``sequences``; only distinct unseen ones reach the oracle.

        Raises:
            RuntimeError: naming the oracle when it raises.
            ValueError: naming the oracle when it returns the wrong number of values, or a value
                that is not a finite number in [0, 1].
        """
        new = list(dict.fromkeys(s for s in sequences if s not in self._cache))
        if new:
            try:
                answers = list(self.oracle(new))
            except Exception as exc:  # any failure of user code becomes one line naming it
                raise RuntimeError(
                    f"amp.oracle {self.name}: raised {type(exc).__name__}: {exc}"
                ) from exc
            if len(answers) != len(new):
                raise ValueError(
                    f"amp.oracle {self.name}: returned {len(answers)} values "
                    f"for {len(new)} sequences"
                )
            if len(self._cache) + len(new) > ORACLE_CACHE_LIMIT:
                self._cache.clear()
            for sequence, answer in zip(new, answers, strict=True):
                value = _probability(answer)
                if value is None:
                    raise ValueError(
                        f"amp.oracle {self.name}: value {answer!r} for {sequence!r} is not a "
                        "probability in [0, 1]"
                    )
                self._cache[sequence] = value
        return [self._cache[s] for s in sequences]


def _probability(answer: object) -> float | None:
    """``answer`` as a float in [0, 1], or None when it is not one (NaN, out of range, a string)."""
    try:
        value = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


@lru_cache(maxsize=1)
def _macrel_session() -> tuple[Any, Callable[[str], Any], Callable[[str], str]]:
    """Macrel's AMP model (an onnxruntime session), its feature function and normaliser."""
    try:
        import onnxruntime
        from macrel.macrel_features import compute_all, normalize_seq
    except ImportError:
        raise ValueError(MACREL_MISSING) from None
    model = resources.files("macrel").joinpath("data", "models", "AMP.onnx.gz")
    with model.open("rb") as handle:
        session = onnxruntime.InferenceSession(
            gzip.decompress(handle.read()), providers=["CPUExecutionProvider"]
        )
    return session, compute_all, normalize_seq


def require_macrel() -> None:
    """Load Macrel's model now; ValueError with the install hint when Macrel is missing."""
    _macrel_session()


def macrel_amp_probability(sequences: list[str]) -> list[float]:
    """Macrel's probability that each peptide (20 standard amino acids) is antimicrobial."""
    if not sequences:
        return []
    session, compute_all, normalize_seq = _macrel_session()
    features = np.array([compute_all(normalize_seq(s)) for s in sequences], dtype=np.float32)
    [probabilities] = session.run(["output_probability"], {"input_features": features})
    return [float(p["AMP"]) for p in probabilities]
