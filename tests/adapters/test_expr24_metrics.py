"""Expr24's report (``adapters.tasks.expr24.metrics``) on hand-computed examples."""

from __future__ import annotations

import pytest

from raptb.adapters.tasks.expr24.metrics import expr24_metrics
from raptb.core.metrics import marginal_divergences, ragged_token_entropy


def sample(text: str, valid: bool, score: float, log_pterm: float) -> dict[str, object]:
    # as a samples.jsonl row: valid = the text parses, correct = it also equals 24
    return {
        "tokens": list(text),
        "valid": valid,
        "correct": valid and score == 1.0,
        "score": score,
        "log_pterm_stop": log_pterm,
    }


def test_expr24_metrics_hand_computed() -> None:
    solutions = ["3*8", "4*6", "6*4", "8*3", "2*3*4"]
    samples = [
        sample("3*8", True, 1.0, -1.0),
        sample("3*8", True, 1.0, -1.0),
        sample("4*6", True, 1.0, -2.0),
        sample("2*3*4", True, 1.0, -3.0),
        sample("3*7", True, 0.0, -4.0),  # parses but is not 24: not valid for the metrics
        sample("3*", False, 0.0, -5.0),
    ]
    result = expr24_metrics(samples, solutions)
    assert result["n_samples"] == 6 and result["n_correct"] == 4
    assert result["acc"] == pytest.approx(4 / 6)
    assert result["score"] == 1.0
    assert (result["unique"], result["cov_count"]) == (3, 3)
    assert result["cov"] == pytest.approx(3 / 5)
    assert result["norm_cov"] == pytest.approx(3 / 5)
    assert result["uniq_rate"] == pytest.approx(3 / 4)
    # the target, uniform over the 5 solutions, at N = 6: 5 (1 - (4/5)^6) distinct correct
    assert result["n_solutions"] == 5
    assert result["target_unique"] == pytest.approx(5 * (1 - 0.8**6))
    assert result["target_norm_cov"] == pytest.approx(1 - 0.8**6)
    assert result["log_pterm"] == pytest.approx(-16 / 6)
    assert result["log_pterm_by_length"] == {"2": -5.0, "3": -2.0, "5": -3.0}
    assert result["len_mean"] == pytest.approx(14 / 4)
    assert result["len50"] == 3.0
    assert result["count_by_length"] == {"3": 3, "5": 1, "7": 0, "9": 0}
    assert result["frac_by_length"]["5"] == pytest.approx(0.25)
    valid = ["3*8", "3*8", "4*6", "2*3*4"]
    assert result["entropy"] == pytest.approx(ragged_token_entropy(valid))
    assert result["prefix"]["surv"][:5] == pytest.approx([1, 1, 1, 0.25, 0.25])
    assert len(result["prefix"]["depth"]) == 9
    expected = marginal_divergences(valid, solutions)
    assert result["kl_pi_p"] == pytest.approx(expected.kl_pi_p)
    assert result["js_tok"] == pytest.approx(expected.js_tok)


def test_expr24_metrics_uses_text_for_multi_character_tokens() -> None:
    samples = [
        {"tokens": [11, 12], "text": "3*8", "correct": True, "score": 1.0, "log_pterm_stop": 0.0}
    ]
    result = expr24_metrics(samples, ["3*8"])
    assert result["cov_count"] == 1
    assert result["kl_pi_p"] == pytest.approx(0.0, abs=1e-12)
    assert result["len_mean"] == 2.0


def test_expr24_metrics_with_no_samples() -> None:
    result = expr24_metrics([], ["3*8"])
    assert result["acc"] == result["cov"] == result["kl_p_pi"] == result["entropy"] == 0.0
    assert result["log_pterm_by_length"] == {}


def test_expr24_metrics_name_a_missing_field() -> None:
    with pytest.raises(ValueError, match="tokens"):
        expr24_metrics([{"correct": True, "score": 1.0, "log_pterm_stop": 0.0}], ["3*8"])
