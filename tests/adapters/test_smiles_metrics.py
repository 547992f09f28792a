"""SMILES's report (``adapters.tasks.smiles.metrics``) on a hand-computed example."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raptb.adapters.tasks.smiles.metrics import smiles_metrics


def _fp(*bits: int) -> np.ndarray:
    words = np.zeros(2, dtype=np.uint64)
    for bit in bits:
        words[bit // 64] |= np.uint64(1 << (bit % 64))
    return words


def _sample(tokens: str, valid: bool, score: float, canonical: str | None) -> dict:
    return {
        "tokens": list(tokens),
        "valid": valid,
        "correct": valid,  # SMILES succeeds exactly on a valid molecule
        "score": score,
        "log_pterm_stop": -1.0,
        "text": tokens,
        "canonical": canonical,
    }


def test_smiles_metrics_hand_example() -> None:
    samples = [
        _sample("CO", True, 0.5, "A"),
        _sample("OC", True, 0.7, "A"),  # another string, the same molecule
        _sample("CN", True, 0.3, "B"),
        _sample("C(", False, 0.0, None),
    ]
    # Tanimoto: {0,1} vs {0,1} = 1; {0,1} vs {1,70} = 1/3
    fps = np.stack([_fp(0, 1), _fp(0, 1), _fp(1, 70), _fp()])
    m = smiles_metrics(samples, fps, max_depth=3)
    assert (m["n_samples"], m["n_valid"], m["acc"]) == (4, 3, 0.75)
    assert m["score"] == pytest.approx(0.5)
    assert (m["uniq_str"], m["uniq_mol"]) == (3, 2)
    assert m["uniq_mol_rate"] == pytest.approx(2 / 3)
    # pairs: (CO,OC) 1, (CO,CN) 1/3, (OC,CN) 1/3 -> mean 5/9
    assert m["fp_div"] == pytest.approx(1 - 5 / 9)
    # bins 0-5 (all three), 6-10 and 11+ empty -> (4/9 + 0 + 0) / 3
    assert m["macro_fp"] == pytest.approx((4 / 9) / 3)
    assert m["by_length"] == {
        "2": {"count": 3, "frac": 1.0, "score": pytest.approx(0.5), "fp_div": pytest.approx(4 / 9),
              "uniq_mol": 2},
    }  # fmt: skip
    # position 0: C, O, C; position 1: O, C, N
    h0 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert m["entropy"] == pytest.approx((h0 + math.log(3)) / 2, abs=1e-8)
    assert m["prefix"]["surv"] == [1.0, 1.0, 0.0]
    assert m["prefix"]["top1"][0] == pytest.approx(2 / 3)
    assert m["len_mean"] == 2.0 and m["log_pterm"] == -1.0


def test_smiles_metrics_checks_shapes() -> None:
    with pytest.raises(ValueError, match="fingerprints"):
        smiles_metrics([_sample("C", True, 0.1, "C")], np.zeros((2, 2), np.uint64), max_depth=2)
    with pytest.raises(ValueError, match="canonical"):
        smiles_metrics([{"tokens": ["C"], "valid": True, "correct": True, "score": 0.1,
                         "log_pterm_stop": 0.0, "text": "C"}],
                       np.zeros((1, 2), np.uint64), max_depth=2)  # fmt: skip
