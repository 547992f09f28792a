"""Per-row prompts in one rollout and in one rescoring forward: rows of prompts of different
lengths, left-padded together, are the rows each prompt would give rolled out alone (tokens,
lengths, both log-prob tensors within 1e-5), their recorded log-probs are the teacher-forced ones
of a separate forward pass per prompt (``HFPolicy.score`` of one prompt, which pads nothing), and
``score`` of mixed prompts equals ``score`` of each row alone."""

from __future__ import annotations

import pytest
import torch

from raptb.adapters.lm.row_prompts import left_padded, row_prompt_ids
from tests.adapters.test_policy import gen, make_policy

# 1, 3 and 9 prompt tokens (with BOS) on the tiny character-level model
PROMPTS = ("", "24:", "Make 24 now:")


@pytest.fixture(scope="module")
def sharp_policy():
    # sharpened so that a tiny temperature makes each draw the argmax, whatever the batch
    return make_policy(seed=3, logit_scale=4.0)


def test_prompts_have_different_lengths(sharp_policy) -> None:
    lengths = {len(sharp_policy.prompt_ids(p)) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)


def test_left_padding_layout() -> None:
    ids, mask, positions = left_padded([[5], [7, 8, 9]], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[0, 0, 5], [7, 8, 9]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert positions.tolist() == [[0, 0, 0], [0, 1, 2]]


def test_row_prompts_must_match_n(sharp_policy) -> None:
    with pytest.raises(ValueError, match="3 prompts"):
        row_prompt_ids(sharp_policy.prompt_ids, ["a", "b"], 3)


def test_mixed_prompts_equal_each_prompt_alone(sharp_policy) -> None:
    policy = sharp_policy
    order = [2, 0, 1, 1, 2, 0]
    prompts = [PROMPTS[i] for i in order]
    cold = 1e-4  # greedy in effect: the same tokens whatever else is in the batch
    mixed = policy.sample(
        prompts, len(prompts), min_length=1, max_length=7, temperature=cold, generator=gen(0)
    )
    for i, prompt in enumerate(PROMPTS):
        rows = [b for b, j in enumerate(order) if j == i]
        alone = policy.sample(
            prompt, len(rows), min_length=1, max_length=7, temperature=cold, generator=gen(1)
        )
        assert torch.equal(mixed.tokens[rows], alone.tokens)
        assert torch.equal(mixed.length[rows], alone.length)
        torch.testing.assert_close(mixed.log_pf[rows], alone.log_pf, atol=1e-5, rtol=0)
        torch.testing.assert_close(mixed.log_pterm[rows], alone.log_pterm, atol=1e-5, rtol=0)
        assert [mixed.texts[b] for b in rows] == alone.texts


def test_mixed_prompts_log_probs_are_teacher_forced(sharp_policy) -> None:
    policy = sharp_policy
    prompts = [PROMPTS[b % 3] for b in range(9)]
    temperature = torch.linspace(0.7, 1.6, 9)
    r = policy.sample(
        prompts, 9, min_length=0, max_length=6, temperature=temperature, generator=gen(5)
    )
    assert len({t for t in r.texts}) > 1  # really sampled
    policy.model.eval()
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            log_pf, log_pterm = policy.score(prompt, r.tokens[b : b + 1], r.length[b : b + 1])
            torch.testing.assert_close(r.log_pf[b : b + 1], log_pf, atol=1e-5, rtol=0)
            torch.testing.assert_close(r.log_pterm[b : b + 1], log_pterm, atol=1e-5, rtol=0)


def test_score_with_row_prompts_equals_scoring_each_prompt_alone(sharp_policy) -> None:
    policy = sharp_policy
    prompts = [PROMPTS[b % 3] for b in range(6)]
    r = policy.sample(prompts, 6, min_length=1, max_length=6, generator=gen(2))
    policy.model.eval()
    with torch.no_grad():
        log_pf, log_pterm = policy.score(prompts, r.tokens, r.length)
        ref_pf, ref_pterm = policy.reference_score(prompts, r.tokens, r.length)
        for b, prompt in enumerate(prompts):
            one = slice(b, b + 1)
            alone_pf, alone_pterm = policy.score(prompt, r.tokens[one], r.length[one])
            torch.testing.assert_close(log_pf[one], alone_pf, atol=1e-5, rtol=0)
            torch.testing.assert_close(log_pterm[one], alone_pterm, atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_pf, log_pf, atol=1e-5, rtol=0)  # a fresh model is its reference
    torch.testing.assert_close(ref_pterm, log_pterm, atol=1e-5, rtol=0)
