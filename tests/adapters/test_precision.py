"""``model_dtype = "bfloat16"``: bfloat16 base weights under float32 LoRA adapters, log-softmax
and sums of log-probabilities in float32 (adapters/lm/precision.py).

On random Llama- and Qwen2-shaped models with the same random LoRA adapters (Hypothesis over the
shape, the weights' seed and the rows), the bfloat16 model against the float32 one: the sequence
log-probabilities, RapTB's loss and logZ's gradient stay within bfloat16's tolerance, the LoRA
gradients are float32 and point the same way; and on the bfloat16 model the log-probabilities are
the float32 log-softmax of its (bfloat16) logits, to float32 rounding. The refusals of
``model_dtype`` each in one line.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from raptb.adapters.lm import precision
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.policy import HFPolicy, to_prefix_batch
from raptb.adapters.lm.precision import dtype_name, model_dtype
from raptb.adapters.lm.tokens import legal_token_ids
from raptb.core.gfn.objectives import objective_by_name

TOKENIZER = build_char_tokenizer()
ALPHABET = "abcdefgh"
PROMPT = "x:"
SHAPE = {  # Llama's and Qwen2's fields: 2 layers, width 64, grouped KV heads
    "vocab_size": len(TOKENIZER),
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),
}
# bfloat16 keeps 8 significant bits (unit roundoff 2**-9 ~ 0.002): the base weights, each product's
# output and the logits are rounded there. Measured on these models (24 draws): a token's
# log-probability moves by at most 0.0013, the loss by 3e-4 of itself, the LoRA gradient's
# direction by a cosine >= 0.99993. The bounds leave about 4x (10x in 1 - cosine) for another
# CPU's order of summation; a log-softmax left in bfloat16 rounds each log-probability (~-4.5
# here) to ~0.009 and fails the token bound (and the dtype and reference checks below).
TOKEN_TOLERANCE = 0.005
MAX_LENGTH = 8
COSINE = 0.999


def _pair(shape: str, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same random model in float32 and with bfloat16 base weights, each with the same random
    LoRA adapters (float32: peft's ``autocast_adapter_dtype``), no dropout."""
    torch.manual_seed(seed)
    base = MODELS[shape]()
    half = copy.deepcopy(base).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, half = (apply_lora(m, rank=4, dropout=0.0) for m in (base, half))
    with torch.no_grad():
        for name, param in full.named_parameters():
            if "lora_B" in name:  # zero at the start (peft's): the adapters of a trained model
                param.normal_(0.0, 0.05)
        half.load_state_dict({k: v for k, v in full.state_dict().items() if "lora_" in k}, False)
    return full.train(), half.train()


def _policy(model: torch.nn.Module) -> HFPolicy:
    stop = TOKENIZER.eos_token_id
    legal = legal_token_ids(TOKENIZER, ALPHABET, stop_id=stop)
    return HFPolicy(model, TOKENIZER, legal_ids=legal, stop_id=stop)


def _lora_gradient(model: torch.nn.Module) -> torch.Tensor:
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
    return torch.cat([g.flatten() for g in grads])


def _scored(policy: HFPolicy, tokens: torch.Tensor, length: torch.Tensor, seed: int) -> dict:
    """Sequence log-probs, RapTB's loss and its gradient in logZ, and the LoRA gradient of the
    sequence log-probs weighted by fixed random weights, all float32."""
    policy.model.zero_grad(set_to_none=True)
    log_z = torch.nn.Parameter(torch.tensor(1.5))
    log_pf, log_pterm = policy.score(PROMPT, tokens, length)
    assert log_pf.dtype == log_pterm.dtype == torch.float32
    draws = torch.Generator().manual_seed(seed)
    u = torch.randn(log_pterm.shape, generator=draws)
    batch = to_prefix_batch(log_pf, log_pterm, u - 3.0, u, length)
    loss, _ = objective_by_name("raptb")(batch, log_z)
    assert loss.dtype == torch.float32
    (log_z_grad,) = torch.autograd.grad(loss, log_z, retain_graph=True)
    assert log_z.dtype == log_z_grad.dtype == torch.float32
    sequence = log_pf.sum(dim=1) + log_pterm[torch.arange(len(length)), length]
    # the loss's own LoRA gradient, sum_b 2 Delta_b grad log p_b, turns with its residuals
    # Delta_b, which are near 0 for some draws: the dtype acts on grad log p_b, held here under
    # weights that do not depend on it
    (torch.randn(len(length), generator=draws) * sequence).sum().backward()
    return {
        "sequence": sequence.detach(),
        "loss": float(loss.detach()),
        "lora": _lora_gradient(policy.model),
        "log_z": float(log_z_grad),
    }


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from(sorted(MODELS)), seed=st.integers(0, 2**16), rows=st.integers(2, 6))
def test_bfloat16_stays_within_its_tolerance_of_float32(shape: str, seed: int, rows: int) -> None:
    full, half = _pair(shape, seed)
    assert {p.dtype for n, p in half.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert not any(p.requires_grad for n, p in half.named_parameters() if "lora_" not in n)
    policies = _policy(full), _policy(half)
    rollout = policies[1].sample(
        PROMPT,
        rows,
        min_length=1,
        max_length=MAX_LENGTH,
        generator=torch.Generator().manual_seed(seed),
    )
    want, got = (_scored(p, rollout.tokens, rollout.length, seed) for p in policies)
    steps = (rollout.length + 1).float()
    assert ((got["sequence"] - want["sequence"]).abs() <= TOKEN_TOLERANCE * steps).all()
    # the loss is a mean of squared residuals of the row sums: its relative error is twice theirs
    scale = float(want["sequence"].abs().max()) + 3.0
    bound = 2 * TOKEN_TOLERANCE * float(steps.max()) / scale
    assert abs(got["loss"] - want["loss"]) <= bound * abs(want["loss"]) + 1e-3
    assert abs(got["log_z"] - want["log_z"]) <= bound * abs(want["log_z"]) + 1e-3
    cosine = torch.nn.functional.cosine_similarity(got["lora"], want["lora"], dim=0)
    assert float(cosine) > COSINE


@pytest.mark.parametrize("shape", sorted(MODELS))
def test_bfloat16_log_probs_are_the_float32_log_softmax_of_its_logits(shape: str) -> None:
    """The model's own forward (the path a sharded model takes), its bfloat16 logits caught at the
    head: the policy's log-probabilities are their log-softmax in float64 within float32 rounding (a
    log-softmax left in bfloat16 is off by ~|log p| 2**-9, ~0.01 here)."""
    _, half = _pair(shape, 7)
    policy = _policy(half)
    rollout = policy.sample(PROMPT, 4, min_length=2, max_length=MAX_LENGTH)
    # a lock-step hook marks the model sharded: the rescoring runs transformers' own forward of
    # every row (adapters/lm/rescoring.path_of), whose head's logits the hook below catches whole
    policy.step_together = lambda stopped: stopped
    caught: list[torch.Tensor] = []
    head = half.get_base_model().get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, _i, out: caught.append(out.detach()))
    try:
        log_pf, log_pterm = policy.score(PROMPT, rollout.tokens, rollout.length)
    finally:
        hook.remove()
    (logits,) = caught
    assert logits.dtype == torch.bfloat16
    width = len(policy.prompt_ids(PROMPT))
    reference = torch.log_softmax(logits[:, width - 1 :].double(), dim=-1)
    tokens = torch.cat([rollout.tokens, torch.full_like(rollout.tokens[:, :1], policy.stop_id)], 1)
    tokens = torch.where(tokens < 0, policy.stop_id, tokens)
    chosen = reference.gather(-1, tokens[..., None]).squeeze(-1)
    big_t = rollout.tokens.shape[1]
    read = torch.arange(big_t)[None, :] < rollout.length[:, None]
    stop_read = torch.arange(big_t + 1)[None, :] <= rollout.length[:, None]
    assert torch.allclose(log_pf[read].double(), chosen[:, :big_t][read], atol=1e-5)
    stop = reference[..., policy.stop_id]
    assert torch.allclose(log_pterm[stop_read].double(), stop[stop_read], atol=1e-5)


CPU = torch.device("cpu")


def test_model_dtype_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert model_dtype("auto", "smollm2-135m", CPU, lora=True) == torch.float32
    assert model_dtype("float32", "tiny", CPU, lora=False) == torch.float32
    assert model_dtype("bfloat16", "smollm2-135m", CPU, lora=True) == torch.bfloat16
    assert [dtype_name(d) for d in (torch.float32, torch.bfloat16)] == ["float32", "bfloat16"]


@pytest.mark.parametrize(
    ("model", "lora", "native", "says"),
    [
        ("tiny", True, True, "the embedded 'tiny' model's compiled CPU kernels are float32"),
        ("smollm2-135m", False, True, "set --lora-rank (e.g. 16) or model_dtype = 'float32'"),
        ("smollm2-135m", True, False, "this CPU has no native bfloat16 dot products"),
    ],
)
def test_bfloat16_refused_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, model: str, lora: bool, native: bool, says: str
) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: native)
    with pytest.raises(ValueError, match=r"^model_dtype: ") as caught:
        model_dtype("bfloat16", model, CPU, lora=lora)
    assert says in str(caught.value) and "\n" not in str(caught.value)
