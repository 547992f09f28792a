"""The ONNX path (adapters/lm/embedded/onnx_rollout.py, onnx_graph.py) against torch.

References: ``lean_gpt2.forward`` (itself held to transformers' forward in test_lean_gpt2.py) for
the step graph's logits and keys and values; the plain reference loop of
test_rollout_identity.py (transformers' forward, torch.multinomial) for whole rollouts: the same
tokens, lengths and texts, the generator left in the same state, the log-probabilities equal up
to float rounding (the two engines' kernels round differently); the eager path for what it shares
with this one (weights updated in place, NaN logits refused, rows with prompts of different
lengths left-padded together).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raptb.adapters.lm.embedded import compiled_rollout, lean_gpt2, onnx_rollout
from raptb.adapters.lm.embedded.onnx_builder import weight_names
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.tasks.expr24.task import Expr24Automaton, expr24_grammar
from tests.adapters.test_policy import GRAMMAR, PROMPT, make_policy
from tests.adapters.test_rollout_identity import ROLLOUT_CASES, reference_rollout

TOLERANCE = 1e-5
"""Log-probabilities of magnitude 0.01-20: the engines' float32 rounding is below 2e-6."""


def perturbed_policy(grammar: str | None, seed: int) -> HFPolicy:
    """The tiny model with every parameter moved off its initialisation (biases and layer norms
    are 0 and 1 there, which would leave their inputs' wiring untested), sharpened logits."""
    policy = make_policy(grammar, seed=seed, logit_scale=4.0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return policy


@pytest.fixture(scope="module", params=["grammar", "free"])
def onnx_policy(request: pytest.FixtureRequest) -> HFPolicy:
    return perturbed_policy(None if request.param == "free" else GRAMMAR, seed=3)


def test_auto_decodes_through_onnx_on_the_cpu(onnx_policy: HFPolicy) -> None:
    assert onnx_policy.decode == "auto" and onnx_policy.decode_path == "onnx"
    lora = make_policy()
    lora.model = apply_lora(lora.model, rank=4, dropout=0.0)
    assert lora.decode_path == "eager"  # (not a model the lean forward supports)
    lora.decode = "onnx"
    with pytest.raises(ValueError, match="onnx needs"):
        _ = lora.decode_path
    half = make_policy()
    half.model.to(torch.bfloat16)
    assert half.decode_path == "eager"
    with pytest.raises(ValueError, match="decode: expected one of"):
        HFPolicy(
            half.model, half.tokenizer, legal_ids=half.legal_ids, stop_id=half.stop_id,
            decode="onnnx",
        )  # fmt: skip


def with_activation(policy: HFPolicy, name: str) -> HFPolicy:
    """``policy``'s model with the MLP activation ``name`` (transformers' ACT2FN)."""
    from transformers.activations import ACT2FN

    policy.model.config.activation_function = name
    for block in policy.model.transformer.h:
        block.mlp.act = ACT2FN[name]
    return policy


def test_activations_outside_the_graph_decode_eagerly() -> None:
    policy = with_activation(make_policy(), "quick_gelu")
    assert policy.decode_path == "eager"


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "gelu_new", "gelu", "relu", "silu"])
def test_step_graph_equals_the_lean_forward(activation: str) -> None:
    policy = with_activation(perturbed_policy(GRAMMAR, seed=5), activation)
    assert policy.decode_path == "onnx"
    model = policy.model
    sub_ids = [*policy.legal_ids, policy.stop_id]
    shape = onnx_rollout.column_shape(model, sub_ids)
    _, step = onnx_rollout.sessions(shape, 1)
    n, generator = 11, torch.Generator().manual_seed(0)
    # prompts of three lengths, left-padded together: the pads masked by key_bias
    prompts = [policy.prompt_ids(("Make 24:", "24:", "Make:")[i % 3]) for i in range(n)]
    with torch.no_grad():
        _, past, position, key_mask = lean_gpt2.prompt_logits_and_past(
            model, prompts, policy.pad_id, torch.device("cpu")
        )
        assert key_mask is not None and not bool(key_mask.all())
        key_bias = np.where(key_mask.numpy(), 0.0, -np.inf).astype(np.float32)
        feeds = {name: model.get_parameter(name).detach().numpy() for name in weight_names(shape)}
        feeds |= {
            "mask": np.ones((n, shape.width), dtype=bool),
            "temperature": np.ones((n, 1), dtype=np.float32),
            "noise": np.ones((n, shape.width), dtype=np.float32),
        }
        onnx_past = [(k.contiguous().numpy(), v.contiguous().numpy()) for k, v in past]
        for _ in range(4):  # four columns, each over the keys and values of those before
            tokens = torch.randint(0, shape.vocab, (n,), generator=generator)
            key_mask = torch.cat([key_mask, key_mask.new_ones((n, 1))], dim=1)
            key_bias = np.concatenate([key_bias, np.zeros((n, 1), np.float32)], axis=1)
            logits, past = lean_gpt2.forward(model, tokens[:, None], position, past, key_mask)
            for layer, (k, v) in enumerate(onnx_past):
                feeds[f"past_k{layer}"], feeds[f"past_v{layer}"] = k, v
            feeds["tokens"], feeds["positions"] = tokens.numpy(), position[:, 0].numpy()
            feeds["key_bias"] = key_bias
            names = ["log_norm", "stop_lp"] + [
                f"present_{kv}{layer}" for layer in range(shape.n_layer) for kv in "kv"
            ]
            log_norm, stop_lp, *present = step.run(names, feeds)
            want = torch.logsumexp(logits[:, -1].double(), dim=-1)
            assert np.abs(log_norm - want.numpy()).max() < TOLERANCE
            stop = logits[:, -1, policy.stop_id].double() - want
            assert np.abs(stop_lp - stop.numpy()).max() < TOLERANCE
            for layer, (k, v) in enumerate(past):
                assert np.abs(present[2 * layer] - k.numpy()).max() < TOLERANCE
                assert np.abs(present[2 * layer + 1] - v.numpy()).max() < TOLERANCE
            onnx_past = list(zip(present[::2], present[1::2], strict=True))
            position = position + 1


def test_sample_graph_on_hand_made_rows() -> None:
    """Three choices (ids 0, 2 and stop 3 of a 4-token vocabulary): masked choices never drawn,
    the temperature divides before the softmax, the first of tied maxima wins, the log-
    probabilities are the untempered full-vocabulary ones."""
    from raptb.adapters.lm.embedded.onnx_graph import ColumnShape, sample_graph

    shape = ColumnShape(
        n_layer=1, n_head=1, n_embd=4, n_inner=16, vocab=4, positions=8, eps=1e-5,
        sub_ids=(0, 2, 3),
    )  # fmt: skip
    import onnxruntime as ort

    session = ort.InferenceSession(sample_graph(shape), providers=["CPUExecutionProvider"])
    logits = np.array(
        [[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 4.0, 0.0]],
        dtype=np.float32,
    )
    mask = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=bool)
    # row 0: p = softmax([0, 1, 2] / 2) over the three; noise makes the choice 0's p / 0.1 win
    # row 1: a tie of p (logits 3 and 3) with equal noise: the first, choice 0
    # row 2: only the stop is allowed; row 3: temperature 0.25 sharpens choice 1 (logit 4)
    temperature = np.array([[2.0], [1.0], [1.0], [0.25]], dtype=np.float32)
    noise = np.array([[0.1, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1e-3], [0.5, 1.0, 0.5]])
    choice, token_lp, stop_lp = session.run(
        ["choice", "token_lp", "stop_lp"],
        {"logits": logits, "mask": mask, "temperature": temperature, "noise": noise.astype("f4")},
    )
    assert choice.tolist() == [0, 0, 2, 1]
    log_norm = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    chosen = np.array([0, 0, 3, 2])  # the vocabulary ids of the choices
    want = logits[np.arange(4), chosen] - log_norm
    assert np.abs(token_lp - want).max() < TOLERANCE
    assert np.abs(stop_lp - (logits[:, 3] - log_norm)).max() < TOLERANCE


@pytest.mark.parametrize(*ROLLOUT_CASES)
def test_rollout_equals_the_reference_loop(
    onnx_policy: HFPolicy,
    seed: int,
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    ref_gen = torch.Generator().manual_seed(seed)
    r = onnx_policy.sample(
        PROMPT, n, min_length=min_length, max_length=max_length, temperature=temperature,
        generator=gen,
    )  # fmt: skip
    tokens, length, log_pf, log_pterm = reference_rollout(
        onnx_policy, n, min_length, max_length, temperature, ref_gen
    )
    assert torch.equal(r.tokens, tokens)
    assert torch.equal(r.length, length)
    assert torch.equal(gen.get_state(), ref_gen.get_state())  # the same draws, in order
    rows = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    assert r.rows == rows
    assert r.texts == [onnx_policy.row_text(row) for row in rows]
    assert torch.allclose(r.log_pf, log_pf, rtol=0, atol=TOLERANCE)
    assert torch.allclose(r.log_pterm, log_pterm, rtol=0, atol=TOLERANCE)
    assert bool(torch.all((r.log_pf == 0) == (log_pf == 0)))  # zero exactly where stopped
    assert bool(torch.all((r.log_pterm == 0) == (log_pterm == 0)))


def on_both_paths(policy: HFPolicy, prompt: str | list[str], n: int, seed: int) -> dict:
    """The rollouts of ``policy`` through ONNX and eagerly, each from generator seed ``seed``."""
    rollouts = {}
    for decode in ("onnx", "eager"):
        policy.decode = decode
        gen = torch.Generator().manual_seed(seed)
        rollouts[decode] = policy.sample(prompt, n, min_length=1, max_length=9, generator=gen)
    return rollouts


def test_follows_weights_updated_in_place() -> None:
    """The graph reads the parameters' memory at each rollout: after an in-place update (as the
    optimizer's) it samples the updated model, as the eager path does."""
    policy = perturbed_policy(GRAMMAR, seed=7)
    policy.sample(PROMPT, 8, min_length=1, max_length=9)  # the sessions built, the weights read
    with torch.no_grad():
        for param in policy.model.parameters():
            param.mul_(1.5)
    rollouts = on_both_paths(policy, PROMPT, 24, seed=11)
    assert torch.equal(rollouts["onnx"].tokens, rollouts["eager"].tokens)
    diff = (rollouts["onnx"].log_pterm - rollouts["eager"].log_pterm).abs().max()
    assert float(diff) < TOLERANCE


def test_follows_parameters_given_new_memory() -> None:
    """A parameter whose ``.data`` is replaced (new memory, as a move or a load by assignment
    gives it) is read anew: the views of the parameters' memory are kept per memory, not per
    parameter."""
    policy = perturbed_policy(GRAMMAR, seed=9)
    policy.sample(PROMPT, 8, min_length=1, max_length=9)  # the views taken
    with torch.no_grad():
        for param in policy.model.parameters():
            param.data = param.data * 1.5 + 0.01  # new tensors, new memory
    rollouts = on_both_paths(policy, PROMPT, 24, seed=12)
    assert torch.equal(rollouts["onnx"].tokens, rollouts["eager"].tokens)
    diff = (rollouts["onnx"].log_pterm - rollouts["eager"].log_pterm).abs().max()
    assert float(diff) < TOLERANCE


@pytest.mark.parametrize("grammar", [GRAMMAR, None])
def test_prompts_of_different_lengths_as_the_eager_path(grammar: str | None) -> None:
    """Rows of prompts of three lengths (left-padded together, as the eager path pads them):
    the eager path's tokens and generator state, its log-probabilities within float rounding,
    not the eager path itself (its log-probabilities are not bit for bit the same)."""
    policy = perturbed_policy(grammar, seed=8)
    prompts = [("Make 24:", "24:", "Make:")[i % 3] for i in range(24)]
    rollouts = on_both_paths(policy, prompts, 24, seed=2)
    onnx, eager = rollouts["onnx"], rollouts["eager"]
    assert torch.equal(onnx.tokens, eager.tokens)
    assert torch.equal(onnx.length, eager.length)
    assert len(set(eager.length.tolist())) > 1
    assert float((onnx.log_pf - eager.log_pf).abs().max()) < TOLERANCE
    assert float((onnx.log_pterm - eager.log_pterm).abs().max()) < TOLERANCE
    assert not torch.equal(onnx.log_pterm, eager.log_pterm)  # two engines' rounding


def test_refuses_non_finite_logits_as_multinomial_does() -> None:
    policy = perturbed_policy(GRAMMAR, seed=9)
    with torch.no_grad():
        policy.model.transformer.ln_f.bias[0] = float("nan")
    for decode in ("onnx", "eager"):
        policy.decode = decode
        with pytest.raises(RuntimeError, match="probability tensor"):
            policy.sample(PROMPT, 4, min_length=1, max_length=9)


def test_auto_takes_onnx_for_small_models_only(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = make_policy()
    assert policy.decode_path == "onnx"
    params = sum(p.numel() for p in policy.model.parameters())
    monkeypatch.setattr(onnx_rollout, "AUTO_MAX_PARAMETERS", params - 1)
    assert policy.decode_path == "eager"  # a model above the size auto takes
    policy.decode = "onnx"
    assert policy.decode_path == "onnx"  # asked for: any size it applies to


ONE_CALL_CASES = [
    # (grammar's length bounds or None, min_length, max_length, temperature per row)
    (None, 1, 9, False),
    ((3, 9), 3, 9, True),
    ((3, 5), 1, 9, False),  # every row stops by column 5: the loop ends early
    (None, 4, 6, True),
]


@pytest.mark.parametrize("prompts", ["two lengths", "shared"])
@pytest.mark.parametrize("engine", ["compiled loop", "graph"])
@pytest.mark.parametrize(("bounds", "min_length", "max_length", "per_row"), ONE_CALL_CASES)
def test_one_call_equals_the_column_loop(
    bounds: tuple[int, int] | None,
    min_length: int,
    max_length: int,
    per_row: bool,
    engine: str,
    prompts: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rollout in one call (no grammar, or an automaton's table), by the compiled loop
    (adapters/lm/embedded/compiled_rollout.py; a prompt all rows share computed inside it) or by
    ONNX Runtime's ``rollout`` graph, against the call per column (held to the reference loop
    above): the same rows and lengths, log-probabilities within float rounding, the generator left
    in the same state."""
    grammar = None if bounds is None else expr24_grammar(*bounds)
    policy = perturbed_policy(grammar, seed=3)
    policy.automaton = None if bounds is None else Expr24Automaton(*bounds)
    policy.decode = "onnx"
    policy.compiled_rollout = engine == "compiled loop"
    calls, compiled = [], []
    one_call, run = onnx_rollout._one_call, compiled_rollout.run
    monkeypatch.setattr(
        onnx_rollout, "_one_call", lambda *a, **k: calls.append(1) or one_call(*a, **k)
    )
    monkeypatch.setattr(
        compiled_rollout, "run", lambda *a: compiled.append("prompt_ids" in a[0]) or run(*a)
    )
    # prompts of two lengths, left-padded together; or one for all
    rows = [PROMPT, "Hi:"] * 12 if prompts == "two lengths" else [PROMPT] * 24
    temperature = torch.linspace(0.7, 1.6, 24) if per_row else 1.3
    rollouts, states = [], []
    for one in (True, False):
        policy.one_call = one
        gen = torch.Generator().manual_seed(7)
        lengths = {"min_length": min_length, "max_length": max_length}
        sample = policy.sample(rows, 24, **lengths, temperature=temperature, generator=gen)
        rollouts.append(sample)
        states.append(gen.get_state())
    assert len(calls) == 1  # the first side took the one call, the second did not
    # by the engine asked for; the compiled loop computing a shared prompt itself
    assert compiled == ([prompts == "shared"] if policy.compiled_rollout else [])
    whole, columns = rollouts
    assert whole.rows == columns.rows and whole.texts == columns.texts
    assert torch.equal(whole.length, columns.length)
    assert len(set(whole.length.tolist())) > 1
    if bounds == (3, 5):
        assert int(whole.length.max()) <= 5 < max_length
    atol = TOLERANCE if policy.compiled_rollout else 1e-6  # (the graph: ONNX Runtime's kernels)
    assert torch.allclose(whole.log_pf, columns.log_pf, rtol=0, atol=atol)
    assert torch.allclose(whole.log_pterm, columns.log_pterm, rtol=0, atol=atol)
    assert bool(torch.all((whole.log_pterm == 0) == (columns.log_pterm == 0)))
    assert torch.equal(states[0], states[1])


def test_matchers_decode_column_by_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar without an automaton (xgrammar's matchers run on the host) takes the call per
    column; without a grammar the one call, which refuses non-finite logits as well."""
    calls = []
    one_call = onnx_rollout._one_call
    monkeypatch.setattr(
        onnx_rollout, "_one_call", lambda *a, **k: calls.append(1) or one_call(*a, **k)
    )
    policy = perturbed_policy(GRAMMAR, seed=9)
    policy.decode = "onnx"
    policy.sample(PROMPT, 4, min_length=1, max_length=9)
    assert not calls
    free = perturbed_policy(None, seed=9)
    free.decode = "onnx"
    with torch.no_grad():
        free.model.transformer.ln_f.bias[0] = float("nan")
    with pytest.raises(RuntimeError, match="probability tensor"):
        free.sample(PROMPT, 4, min_length=1, max_length=9)
    assert calls == [1]
