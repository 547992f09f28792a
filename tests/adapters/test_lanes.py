"""adapters.lm.lanes: work split into lanes side by side.

- ``split``: contiguous, covering, sizes within one of each other (Hypothesis);
- gradients: micro-batches of a LoRA-wrapped random Llama-shaped model in two lanes
  (``app.training.micro_batch.run_micro_batches``) give the gradients of the same micro-batches
  one after the other, within float32 reordering; with dropout on, two runs from one seed give the
  same gradients bit for bit (each lane's masks from its own seed, whichever lane runs first); a
  non-finite micro-batch ends the results there;
- the rollout: a lane rollout's rows are those of each lane's rows rolled out alone from the seed
  drawn for that lane (per-row prompts and temperatures, with and without a grammar), the same on
  a second call, and the model's mode is restored; the rows' prompt forwarded once for all
  lanes;
- ``lane_count``: the lanes asked, or two (at most torch's threads) for a pretrained model on a
  CPU, else 1; a sharded model one, with a warning where more were asked; each lane its share
  of torch's threads.
- lanes run under their caller's autograd modes (no_grad, inference_mode);
- the reference pass in lanes: each lane forwards its part of the rows in a thread of its own,
  peft's adapter off in every lane, the values of one lane within float32 reordering (rows with
  prompts of their own); ``run`` called inside a lane runs its parts in turn.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from raptb.adapters.lm.lanes import SHARDED_ONE_LANE, Lanes, backward, lane_count, split
from raptb.adapters.lm.policy import HFPolicy
from raptb.app.training.micro_batch import run_micro_batches
from tests.adapters.test_policy import PROMPT
from tests.adapters.test_static_decode import GRAMMAR, llama_lora_policy

torch.set_num_threads(1)


@given(st.integers(0, 50), st.integers(1, 8))
def test_split_covers_in_order_with_sizes_within_one(count: int, parts: int) -> None:
    ranges = split(count, parts)
    assert [i for r in ranges for i in r] == list(range(count))
    sizes = [len(r) for r in ranges]
    assert len(ranges) == max(1, min(parts, count))
    assert max(sizes) - min(sizes) <= 1
    assert count == 0 or min(sizes) >= 1


@pytest.fixture(scope="module")
def llama() -> HFPolicy:
    return llama_lora_policy(None)


def _rows(policy: HFPolicy, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    policy.lanes = Lanes(1)
    out = policy.sample(
        PROMPT, n, min_length=1, max_length=6, generator=torch.Generator().manual_seed(seed)
    )
    return out.tokens, out.length


def _gradients(policy: HFPolicy, lanes: int, nonfinite: int | None = None) -> tuple[list, int]:
    """Each trainable parameter's gradient after four micro-batches of 3 rows (loss: the rows'
    log-probabilities summed, each micro-batch weighted 1/4), and how many results came back."""
    tokens, length = _rows(policy, 12, seed=5)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    batches = [[(SimpleNamespace(rows=list(range(3))), None)] for _ in range(4)]

    def loss(parts: object, rows: slice) -> object:
        if rows.start // 3 == nonfinite:
            return None
        log_pf, log_pterm = policy.score(PROMPT, tokens[rows], length[rows])
        value = log_pf.sum() + log_pterm.sum()
        backward(value / 4)
        return float(value.detach())

    results = run_micro_batches(batches, loss, Lanes(lanes), params)
    return [None if p.grad is None else p.grad.clone() for p in params], len(results)


def test_two_lanes_give_the_gradients_of_one_after_the_other(llama: HFPolicy) -> None:
    llama.model.eval()  # no dropout: the same function in both
    one, _ = _gradients(llama, 1)
    two, count = _gradients(llama, 2)
    assert count == 4
    assert sum(g is not None for g in one) > 0
    for a, b in zip(one, two, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_with_dropout_two_lanes_repeat_bit_for_bit(llama: HFPolicy) -> None:
    llama.model.train()
    torch.manual_seed(11)
    first, _ = _gradients(llama, 2)
    torch.manual_seed(11)
    second, _ = _gradients(llama, 2)
    llama.model.eval()
    plain, _ = _gradients(llama, 2)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True) if a is not None)
    # and dropout did act: without it the gradients differ
    assert any(not torch.equal(a, b) for a, b in zip(first, plain, strict=True) if a is not None)


def test_a_nonfinite_micro_batch_ends_the_results(llama: HFPolicy) -> None:
    llama.model.eval()
    assert _gradients(llama, 2, nonfinite=1)[1] == 1
    assert _gradients(llama, 2, nonfinite=3)[1] == 3


@pytest.mark.parametrize("grammar", [None, GRAMMAR], ids=["free", "grammar"])
def test_a_lane_rollout_is_each_lanes_rows_rolled_out_from_its_seed(grammar: str | None) -> None:
    policy = llama_lora_policy(grammar)
    policy.model.train()
    n = 7
    prompts = [PROMPT if i % 2 else "" for i in range(n)]
    temps = torch.linspace(0.7, 1.5, n)
    kwargs = {"min_length": 1, "max_length": 6}
    policy.lanes = Lanes(2)
    both = policy.sample(
        prompts, n, temperature=temps, generator=torch.Generator().manual_seed(3), **kwargs
    )
    again = policy.sample(
        prompts, n, temperature=temps, generator=torch.Generator().manual_seed(3), **kwargs
    )
    assert policy.model.training
    seeds = torch.randint(0, 2**62, (2,), generator=torch.Generator().manual_seed(3)).tolist()
    policy.lanes = Lanes(1)
    alone = [
        policy.sample(
            prompts[rows.start : rows.stop],
            len(rows),
            temperature=temps[rows.start : rows.stop],
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )
        for rows, seed in zip(split(n, 2), seeds, strict=True)
    ]
    for out in (both, again):
        assert torch.equal(out.tokens, torch.cat([a.tokens for a in alone]))
        assert torch.equal(out.length, torch.cat([a.length for a in alone]))
        assert out.texts == [t for a in alone for t in a.texts]
        torch.testing.assert_close(
            out.log_pf, torch.cat([a.log_pf for a in alone]), rtol=0, atol=1e-5
        )
        torch.testing.assert_close(
            out.log_pterm, torch.cat([a.log_pterm for a in alone]), rtol=0, atol=1e-5
        )
    assert len(set(both.length.tolist())) > 1  # rows stop at different lengths


def test_a_lane_rollout_forwards_its_prompt_once() -> None:
    """The rows' shared prompt is forwarded once for all lanes (not once a lane): one forward of
    more than one position, then one a token."""
    policy = llama_lora_policy(None)
    decoder = policy.model.get_base_model().get_decoder()
    widths: list[int] = []
    hook = decoder.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    policy.lanes = Lanes(2)
    try:
        out = policy.sample(
            PROMPT, 6, min_length=1, max_length=5, generator=torch.Generator().manual_seed(2)
        )
    finally:
        hook.remove()
    assert len(out.texts) == 6
    assert sum(width > 1 for width in widths) == 1
    assert widths[0] == len(policy.prompt_ids(PROMPT)) > 1


def test_lane_count() -> None:
    cpu = torch.device("cpu")
    warned: list[str] = []

    def count(asked: int | None, device: torch.device = cpu, **kw: object) -> int:
        return lane_count(asked, device, kw.get("lean", False), kw.get("sharding"), warned.append)

    torch.set_num_threads(2)
    try:
        assert count(None) == 2
        assert Lanes(2).threads == 1
        torch.set_num_threads(4)  # more cores: two lanes, each with its share of the threads
        assert count(None) == 2
        assert Lanes(2).threads == 2
    finally:
        torch.set_num_threads(1)
    assert count(None) == 1
    assert count(None, lean=True) == 1
    assert count(None, torch.device("cuda")) == 1
    assert count(3) == 3 and count(3, lean=True) == 3  # asked: taken as asked
    assert warned == []
    assert count(None, sharding=object()) == 1 and warned == []
    assert count(2, sharding=object()) == 1 and warned == [SHARDED_ONE_LANE]
    with pytest.raises(ValueError, match="lanes: must be >= 1"):
        Lanes(0)


def test_lanes_run_under_the_callers_autograd_modes() -> None:
    """Grad and inference modes are a thread's own: a lane takes its caller's (a lane rollout under
    ``torch.no_grad`` must not record a graph)."""
    weight = torch.ones(2, requires_grad=True)

    def seen() -> tuple[bool, bool, bool]:
        out = weight * 2
        return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), out.requires_grad

    lanes = Lanes(2)
    assert lanes.run([seen, seen]) == [(True, False, True)] * 2
    with torch.no_grad():
        assert lanes.run([seen, seen]) == [(False, False, False)] * 2
    with torch.inference_mode():
        assert lanes.run([seen, seen]) == [(False, True, False)] * 2
    assert lanes.run([seen, seen]) == [(True, False, True)] * 2


def test_the_reference_pass_in_lanes_is_the_one_lane_pass() -> None:
    policy = llama_lora_policy(None)
    prompts = [PROMPT, "", PROMPT, "24:", "ab", PROMPT, "", "24:"]
    out = policy.sample(
        prompts, 8, min_length=1, max_length=6, generator=torch.Generator().manual_seed(3)
    )
    decoder = policy.model.get_base_model().get_decoder()
    seen: list[tuple[str, int]] = []
    hook = decoder.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(
            (threading.current_thread().name, kwargs["input_ids"].shape[0])
        ),
        with_kwargs=True,
    )
    try:
        policy.lanes = Lanes(1)
        one = policy.reference_score(prompts, out.tokens, out.length)
        assert {name for name, _ in seen} == {threading.current_thread().name}
        seen.clear()
        policy.lanes = Lanes(2)
        two = policy.reference_score(prompts, out.tokens, out.length)
    finally:
        hook.remove()
        policy.lanes.close()
    lanes = {name for name, _ in seen}
    assert len(lanes) == 2 and all(name.startswith("raptb-lane") for name in lanes)
    assert all(rows < 8 for _, rows in seen)  # each lane forwards its part of the rows
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # the adapter was off in the lanes: the adapted model's values differ
    with torch.no_grad():
        adapted = policy.score(prompts, out.tokens, out.length)
    assert not torch.allclose(adapted[0], two[0], atol=1e-3)


def test_run_inside_a_lane_runs_its_parts_in_turn() -> None:
    lanes = Lanes(2)

    def inner() -> tuple[str, list[str]]:
        return threading.current_thread().name, lanes.run(
            [lambda: threading.current_thread().name] * 2
        )

    try:
        runs = lanes.run([inner, inner])  # (with a pool of two, a nested submit could deadlock)
    finally:
        lanes.close()
    for lane, parts in runs:
        assert lane.startswith("raptb-lane") and parts == [lane, lane]
