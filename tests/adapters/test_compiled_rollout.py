"""The compiled rollout (adapters/lm/embedded/compiled_rollout.py, rollout_kernels.py,
compiled_gpt2.py, weights.py) against torch.

References: the plain reference loop of test_rollout_identity.py (transformers' forward,
torch.multinomial) and the eager path (held to that loop bit for bit there) for whole rollouts:
the same tokens, lengths and texts, the generator left in the same state, the log-probabilities
equal up to float rounding (the two engines' kernels round differently); on the SMILES task
(xgrammar's matchers: a compiled call per column) and on Expr24 (its automaton: the whole rollout
in one compiled call), on random prompts, row counts, lengths and temperatures.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.decode_mode import resolve_decode
from raptb.adapters.lm.embedded import compiled_rollout
from raptb.adapters.lm.embedded.rollout_kernels import _draw
from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import Rollout
from raptb.adapters.lm.table_grammar import TableGrammarBatch
from raptb.adapters.tasks.expr24.task import Expr24Automaton, expr24_grammar
from raptb.app.configuration.config import build_config
from raptb.app.task_and_policy import build_policy, build_task
from tests.adapters.test_policy import GRAMMAR, PROMPT, make_policy
from tests.adapters.test_rollout_identity import ROLLOUT_CASES, reference_rollout

TOLERANCE = 1e-5
"""Log-probabilities of magnitude 0.01-20: the engines' float32 rounding is below 2e-6."""


def perturb(policy: HFPolicy, seed: int) -> HFPolicy:
    """Every parameter moved off its initialisation (biases and layer norms are 0 and 1 there,
    which would leave their inputs' wiring untested)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return policy


def perturbed_policy(grammar: str | None, seed: int) -> HFPolicy:
    """The tiny model, perturbed, with sharpened logits."""
    return perturb(make_policy(grammar, seed=seed, logit_scale=4.0), seed)


def on_both_paths(policy: HFPolicy, prompt: str | list[str], n: int, seed: int, **kw) -> dict:
    """The rollouts of ``policy`` compiled and eagerly, each from generator seed ``seed``, with
    the generator's state after each."""
    kw = {"min_length": 1, "max_length": 9} | kw
    rollouts = {}
    for decode in ("compiled", "eager"):
        policy.decode = decode
        gen = torch.Generator().manual_seed(seed)
        rollouts[decode] = (policy.sample(prompt, n, generator=gen, **kw), gen.get_state())
    return rollouts


def assert_same_rollout(rollouts: dict[str, tuple[Rollout, torch.Tensor]]) -> None:
    """The same rows, lengths, texts and generator state; log-probabilities within TOLERANCE,
    zero at the same places."""
    (mine, mine_state), (eager, eager_state) = rollouts["compiled"], rollouts["eager"]
    assert torch.equal(mine.tokens, eager.tokens)
    assert torch.equal(mine.length, eager.length)
    assert mine.rows == eager.rows and mine.texts == eager.texts
    assert torch.equal(mine_state, eager_state)  # the same draws, in order
    assert torch.allclose(mine.log_pf, eager.log_pf, rtol=0, atol=TOLERANCE)
    assert torch.allclose(mine.log_pterm, eager.log_pterm, rtol=0, atol=TOLERANCE)
    assert bool(torch.all((mine.log_pf == 0) == (eager.log_pf == 0)))
    assert bool(torch.all((mine.log_pterm == 0) == (eager.log_pterm == 0)))


@pytest.fixture(scope="module", params=["grammar", "free"])
def compiled_policy(request: pytest.FixtureRequest) -> HFPolicy:
    return perturbed_policy(None if request.param == "free" else GRAMMAR, seed=3)


def test_auto_decodes_compiled_on_the_cpu(compiled_policy: HFPolicy) -> None:
    assert compiled_policy.decode == "auto" and compiled_policy.decode_path == "compiled"
    lora = make_policy()
    lora.model = apply_lora(lora.model, rank=4, dropout=0.0)
    assert lora.decode_path == "eager"  # (not a model the lean forward supports)
    lora.decode = "compiled"
    with pytest.raises(ValueError, match="compiled needs"):
        _ = lora.decode_path
    half = make_policy()
    half.model.to(torch.bfloat16)
    assert half.decode_path == "eager"
    with pytest.raises(ValueError, match="decode: expected one of"):
        HFPolicy(
            half.model, half.tokenizer, legal_ids=half.legal_ids, stop_id=half.stop_id,
            decode="compield",
        )  # fmt: skip


def test_onnx_is_read_as_compiled_with_a_warning() -> None:
    """``decode = "onnx"``, the former name: the compiled path, a FutureWarning naming it."""
    policy = make_policy()
    with pytest.warns(FutureWarning, match='now called "compiled"'):
        renamed = HFPolicy(
            policy.model, policy.tokenizer, legal_ids=policy.legal_ids, stop_id=policy.stop_id,
            decode="onnx",
        )  # fmt: skip
    assert renamed.decode == "compiled" and renamed.decode_path == "compiled"
    with pytest.warns(FutureWarning, match='write decode = "compiled"'):
        path = resolve_decode("onnx", torch.device("cpu"), sharded=False, compiled=True)
    assert path == "compiled"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_decode("compiled", torch.device("cpu"), sharded=False, compiled=True)


def test_auto_takes_compiled_for_small_models_only(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = make_policy()
    assert policy.decode_path == "compiled"
    params = sum(p.numel() for p in policy.model.parameters())
    monkeypatch.setattr(compiled_rollout, "AUTO_MAX_PARAMETERS", params - 1)
    assert policy.decode_path == "eager"  # a model above the size auto takes
    policy.decode = "compiled"
    assert policy.decode_path == "compiled"  # asked for: any size it applies to


def with_activation(policy: HFPolicy, name: str) -> HFPolicy:
    """``policy``'s model with the MLP activation ``name`` (transformers' ACT2FN)."""
    from transformers.activations import ACT2FN

    policy.model.config.activation_function = name
    for block in policy.model.transformer.h:
        block.mlp.act = ACT2FN[name]
    return policy


def test_activations_outside_the_kernels_decode_eagerly() -> None:
    assert with_activation(make_policy(), "quick_gelu").decode_path == "eager"


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "gelu_new", "gelu", "relu", "silu"])
def test_every_activation_as_the_eager_path(activation: str) -> None:
    """Prompts of three lengths (left-padded together: the pads masked by the key bias)."""
    policy = with_activation(perturbed_policy(GRAMMAR, seed=5), activation)
    prompts = [("Make 24:", "24:", "Make:")[i % 3] for i in range(12)]
    assert_same_rollout(on_both_paths(policy, prompts, 12, seed=4))


def test_draw_on_hand_made_rows() -> None:
    """Three choices (ids 0, 2 and stop 3 of a 4-token vocabulary): masked choices never drawn,
    the temperature divides before the softmax, the first of tied maxima wins."""
    logits = np.array(
        [[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 4.0, 0.0]],
        dtype=np.float32,
    )
    mask = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=bool)
    # row 0: p = softmax([0, 1, 2] / 2) over the three; noise makes the choice 0's p / 0.1 win
    # row 1: a tie of p (logits 3 and 3) with equal noise: the first, choice 0
    # row 2: only the stop is allowed; row 3: temperature 0.25 sharpens choice 1 (logit 4)
    temperature = np.array([2.0, 1.0, 1.0, 0.25], dtype=np.float32)
    noise = np.array([[0.1, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1e-3], [0.5, 1.0, 0.5]])
    sub_ids, behaviour = np.array([0, 2, 3]), np.empty(3, np.float32)
    choices = [
        _draw(logits[i], mask[i], sub_ids, temperature[i], noise[i].astype("f4"), behaviour)
        for i in range(4)
    ]
    assert choices == [0, 0, 2, 1]


@pytest.mark.parametrize(*ROLLOUT_CASES)
def test_rollout_equals_the_reference_loop(
    compiled_policy: HFPolicy,
    seed: int,
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    ref_gen = torch.Generator().manual_seed(seed)
    r = compiled_policy.sample(
        PROMPT, n, min_length=min_length, max_length=max_length, temperature=temperature,
        generator=gen,
    )  # fmt: skip
    tokens, length, log_pf, log_pterm = reference_rollout(
        compiled_policy, n, min_length, max_length, temperature, ref_gen
    )
    assert torch.equal(r.tokens, tokens)
    assert torch.equal(r.length, length)
    assert torch.equal(gen.get_state(), ref_gen.get_state())  # the same draws, in order
    rows = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    assert r.rows == rows
    assert r.texts == [compiled_policy.row_text(row) for row in rows]
    assert torch.allclose(r.log_pf, log_pf, rtol=0, atol=TOLERANCE)
    assert torch.allclose(r.log_pterm, log_pterm, rtol=0, atol=TOLERANCE)
    assert bool(torch.all((r.log_pf == 0) == (log_pf == 0)))  # zero exactly where stopped
    assert bool(torch.all((r.log_pterm == 0) == (log_pterm == 0)))


def task_policy(task: str) -> HFPolicy:
    """The policy ``raptb train`` builds for ``task`` with the embedded model, perturbed."""
    config = build_config(overrides={"model": "tiny", "task": task})
    built = build_task(config)
    policy = build_policy(config.model, built, config.seed, lora=config.lora)
    with torch.no_grad():
        policy.model.transformer.ln_f.weight.mul_(3.0)
    return perturb(policy, seed=1)


@pytest.fixture(scope="module", params=["smiles", "expr24"])
def task_and_policy(request: pytest.FixtureRequest) -> tuple[str, HFPolicy]:
    return request.param, task_policy(request.param)


PROMPT_TEXT = st.text(alphabet="CNOc1()=Make 24:", min_size=1, max_size=6)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    bounds=st.tuples(st.integers(0, 6), st.integers(0, 14)),
)
def test_a_task_rolls_out_as_the_eager_path(
    task_and_policy: tuple[str, HFPolicy],
    data: st.DataObject,
    n: int,
    seed: int,
    bounds: tuple[int, int],
) -> None:
    """SMILES (xgrammar's matchers: the host fills each column's masks) and Expr24 (its
    automaton: one compiled call), random prompts (one for all rows, or each row's, of different
    lengths), row counts, lengths and per-row temperatures."""
    task, policy = task_and_policy
    expected = GrammarBatch if task == "smiles" else TableGrammarBatch
    assert isinstance(policy.grammar_batch(n), expected)
    if data.draw(st.booleans()):
        prompt: str | list[str] = data.draw(PROMPT_TEXT)
    else:
        prompt = data.draw(st.lists(PROMPT_TEXT, min_size=n, max_size=n))
    temps = data.draw(st.lists(st.floats(0.3, 3.0), min_size=n, max_size=n))
    lengths = {"min_length": min(bounds), "max_length": max(bounds)}
    temperature = torch.tensor(temps, dtype=torch.float32)
    rollouts = on_both_paths(policy, prompt, n, seed, temperature=temperature, **lengths)
    assert_same_rollout(rollouts)


@pytest.mark.parametrize("prompts", ["two lengths", "shared"])
@pytest.mark.parametrize(
    ("bounds", "min_length", "max_length"), [((3, 9), 3, 9), ((3, 5), 1, 9), ((1, 9), 0, 4)]
)
def test_one_call_equals_the_columns_from_the_host(
    bounds: tuple[int, int],
    min_length: int,
    max_length: int,
    prompts: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Expr24 grammar as its automaton (one compiled call for the rollout) and as xgrammar's
    matchers (a compiled call per column, the masks filled on the host): the same rollout, bit
    for bit (the same kernels), and the generator left in the same state."""
    policy = perturbed_policy(expr24_grammar(*bounds), seed=3)
    calls: list[str] = []
    for name in ("_one_call", "_host_columns"):
        original = getattr(compiled_rollout, name)
        monkeypatch.setattr(
            compiled_rollout, name, lambda *a, o=original, k=name: calls.append(k) or o(*a)
        )
    rows = [PROMPT, "Hi:"] * 12 if prompts == "two lengths" else [PROMPT] * 24
    temperature = torch.linspace(0.7, 1.6, 24)
    rollouts, states = [], []
    for automaton in (Expr24Automaton(*bounds), None):
        policy.automaton = automaton
        gen = torch.Generator().manual_seed(7)
        lengths = {"min_length": min_length, "max_length": max_length}
        rollouts.append(policy.sample(rows, 24, **lengths, temperature=temperature, generator=gen))
        states.append(gen.get_state())
    assert calls == ["_one_call", "_host_columns"]
    whole, columns = rollouts
    assert whole.rows == columns.rows and whole.texts == columns.texts
    assert torch.equal(whole.length, columns.length)
    assert len(set(whole.length.tolist())) > 1
    if bounds == (3, 5):
        assert int(whole.length.max()) <= 5 < max_length  # every row stopped: the loop ended early
    assert torch.equal(whole.log_pf, columns.log_pf)
    assert torch.equal(whole.log_pterm, columns.log_pterm)
    assert torch.equal(states[0], states[1])


def test_follows_weights_updated_in_place_or_given_new_memory() -> None:
    """The weights are packed at each rollout: after an in-place update (as the optimizer's) or
    a parameter given new memory (a move, a load by assignment) it samples the updated model,
    as the eager path does."""
    policy = perturbed_policy(GRAMMAR, seed=7)
    policy.sample(PROMPT, 8, min_length=1, max_length=9)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.mul_(1.5)
    assert_same_rollout(on_both_paths(policy, PROMPT, 24, seed=11))
    with torch.no_grad():
        for param in policy.model.parameters():
            param.data = param.data * 0.8 + 0.01
    assert_same_rollout(on_both_paths(policy, PROMPT, 24, seed=12))


@pytest.mark.parametrize("grammar", [GRAMMAR, None])
def test_refuses_non_finite_logits_as_multinomial_does(grammar: str | None) -> None:
    """On both routes: the call per column (xgrammar's matchers) and the one call."""
    policy = perturbed_policy(grammar, seed=9)
    with torch.no_grad():
        policy.model.transformer.ln_f.bias[0] = float("nan")
    for decode in ("compiled", "eager"):
        policy.decode = decode
        with pytest.raises(RuntimeError, match="probability tensor"):
            policy.sample(PROMPT, 4, min_length=1, max_length=9)
