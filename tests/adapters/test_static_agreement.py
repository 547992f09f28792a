"""The static decoder against the eager rollout on random tiny Llama-, Qwen2- and GPT-2-shaped
models (grouped or full KV heads, tied or untied embeddings, LoRA or not), one prompt for every
row or left-padded prompts per row, per-row temperatures, with Expr24's grammar or without: the
same seed takes the same random draws and ``decode_agreement.compare_rollouts`` never finds a
genuine difference (the same rows and log-probs within 1e-5 of each other, or a difference that
leaves the static path as near an independent float64 reference as the eager one, with every
flipped draw its own logits' winner), and both paths lie within float32 rounding of that
reference. The verdicts themselves are checked on a static path shifted on purpose by a
rounding-sized amount and by a larger one.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from raptb.adapters.lm.gpu.decode_agreement import (
    Agreement,
    compare_rollouts,
    float64_copy,
)
from raptb.adapters.lm.gpu.static_decode import static_logits
from raptb.adapters.lm.gpu.static_decoder import StaticDecoder
from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import eager_logits
from raptb.adapters.lm.rollout_record import row_temperatures, token_log_probs
from raptb.adapters.lm.row_prompts import row_prompt_ids
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.adapters.tasks.expr24.task import expr24_grammar
from tests.adapters.test_policy import ALPHABET

torch.set_num_threads(1)

GRAMMAR = expr24_grammar(1, 9)
PROMPTS = ["Make 24:", "", "24 from 1 2 3 4, please:", "1+1", "x"]
FAMILIES = ("llama", "qwen2", "gpt2")


def tiny_model(
    family: str, *, layers: int, heads: int, kv_heads: int, tied: bool, seed: int, sharp: float
) -> torch.nn.Module:
    """A random model of ``family`` over the character tokenizer (head width 8), its final norm
    scaled by ``sharp`` so that rows stop at varied lengths."""
    tokenizer, width = build_char_tokenizer(), 8 * heads
    common = {"vocab_size": len(tokenizer), "tie_word_embeddings": tied}
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family == "gpt2":
            config = GPT2Config(
                n_embd=width, n_layer=layers, n_head=heads, n_positions=64, **common
            )
            model = GPT2LMHeadModel(config)
            norm = model.transformer.ln_f
        else:
            kind = {
                "llama": (LlamaConfig, LlamaForCausalLM),
                "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            }
            config_class, model_class = kind[family]
            config = config_class(
                hidden_size=width,
                intermediate_size=2 * width,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                max_position_embeddings=64,
                **common,
                **special,
            )
            model = model_class(config)
            norm = model.model.norm
        with torch.no_grad():
            norm.weight.mul_(sharp)
    return model.eval()


def make_policy(model: torch.nn.Module, grammar: str | None, lora: bool) -> HFPolicy:
    if lora:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = apply_lora(model, rank=2, dropout=0.1)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, 0.3)
    tokenizer = build_char_tokenizer()
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    return HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=grammar)


def both_paths(
    policy: HFPolicy,
    prompt: str | list[str],
    n: int,
    seed: int,
    **kwargs: object,
) -> Agreement:
    """Eager then static rollouts of the same seed: the same random draws, and their agreement."""
    rollouts, states = {}, {}
    for decode in ("eager", "static"):
        policy.decode = decode  # type: ignore[assignment]
        generator = torch.Generator().manual_seed(seed)
        rollouts[decode] = policy.sample(prompt, n, generator=generator, **kwargs)  # type: ignore[arg-type]
        states[decode] = generator.get_state()
    assert torch.equal(states["static"], states["eager"])  # the same random draws were taken
    return compare_rollouts(
        policy,
        float64_copy(policy.model),
        row_prompt_ids(policy.prompt_ids, prompt, n),
        rollouts["eager"],
        rollouts["static"],
        generator=torch.Generator().manual_seed(seed),
        temperature=row_temperatures(kwargs.get("temperature", 1.0), n),  # type: ignore[arg-type]
        always_reference=True,
    )


@st.composite
def cases(draw: st.DrawFn) -> dict[str, object]:
    heads = draw(st.sampled_from([2, 4]))
    family = draw(st.sampled_from(FAMILIES))
    model = {
        "family": family,
        "layers": draw(st.integers(1, 2)),
        "heads": heads,
        # grouped-query attention: fewer key/value heads than query heads
        "kv_heads": heads if family == "gpt2" else draw(st.sampled_from([1, 2, heads])),
        "tied": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
        "sharp": draw(st.floats(2.0, 12.0)),
    }
    n = draw(st.integers(1, 12))
    per_row = draw(st.booleans())
    prompt = [draw(st.sampled_from(PROMPTS)) for _ in range(n)] if per_row else PROMPTS[0]
    max_length = draw(st.integers(0, 10))
    return {
        "model": model,
        "grammar": draw(st.booleans()),
        "lora": draw(st.booleans()),
        "prompt": prompt,
        "n": n,
        "min_length": draw(st.integers(0, max_length)),
        "max_length": max_length,
        "temperature": torch.tensor(draw(st.lists(st.floats(0.3, 3.0), min_size=n, max_size=n))),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_static_equals_eager_on_random_models(case: dict) -> None:
    model = tiny_model(**case["model"])
    policy = make_policy(model, GRAMMAR if case["grammar"] else None, case["lora"])
    agreement = both_paths(
        policy,
        case["prompt"],
        case["n"],
        case["seed"],
        min_length=case["min_length"],
        max_length=case["max_length"],
        temperature=case["temperature"],
    )
    assert agreement.verdict != "genuine", agreement.describe()
    # both within float32 rounding of the float64 reference: a fault the two paths share (the
    # prompts, their padding) would be ~0.1 here
    assert agreement.eager_error is not None and agreement.static_error is not None
    assert max(agreement.eager_error, agreement.static_error) < 1e-3, agreement.describe()


TIED = ("3", "7")
"""Two legal tokens whose logits the test model ties at the top of every row."""


@pytest.mark.parametrize(("shift", "verdict"), [(2e-6, "rounding"), (1e-3, "genuine")])
def test_a_flipped_draw_is_told_rounding_or_genuine(
    monkeypatch: pytest.MonkeyPatch, shift: float, verdict: str
) -> None:
    """A model whose two tokens ``TIED`` lead every row with equal logits, decoded near greedily
    (temperature 1e-5): the eager path draws between them by the noise alone; a static path
    that adds ``shift`` to the second one's logit (rounding-sized, or far above rounding) flips
    some draws. ``compare_rollouts`` finds the first flip, its numbers hold what the module
    docstring says, and the verdict follows the shift's size."""
    model = tiny_model("llama", layers=1, heads=2, kv_heads=1, tied=False, seed=0, sharp=4.0)
    policy = make_policy(model, None, lora=False)
    first, second = (policy.tokenizer.convert_tokens_to_ids(text) for text in TIED)

    def tie(module: torch.nn.Module, inputs: object, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        top = logits.amax(dim=-1) + 1.0
        logits[..., first] = logits[..., second] = top
        return logits

    reference = float64_copy(policy.model)
    for each in (policy.model, reference):
        each.get_output_embeddings().register_forward_hook(tie)
    # the static decoder's logits buffer, after its prefill and after each forward
    for part in ("start", "_forward_part"):
        original = getattr(StaticDecoder, part)

        def shifted(self: StaticDecoder, *args: object, original=original) -> None:  # type: ignore[no-untyped-def]
            original(self, *args)
            self.logits[:, second] += shift

        monkeypatch.setattr(StaticDecoder, part, shifted)
    n, temp, rollouts = 16, torch.full((16,), 1e-5), {}
    for decode in ("eager", "static"):
        policy.decode = decode  # type: ignore[assignment]
        generator = torch.Generator().manual_seed(0)
        rollouts[decode] = policy.sample(
            PROMPTS[0], n, min_length=3, max_length=3, temperature=temp, generator=generator
        )
    agreement = compare_rollouts(
        policy,
        reference,
        [policy.prompt_ids(PROMPTS[0])] * n,
        rollouts["eager"],
        rollouts["static"],
        generator=torch.Generator().manual_seed(0),
        temperature=temp,
    )
    assert agreement.verdict == verdict, agreement.describe()
    parting = agreement.parting
    assert parting is not None and not agreement.same_rows
    sub = {policy.legal_ids.index(first), policy.legal_ids.index(second)}
    assert {parting.eager_choice, parting.static_choice} == sub
    assert rollouts["eager"].tokens[parting.row, : parting.column].tolist() == (
        rollouts["static"].tokens[parting.row, : parting.column].tolist()
    )
    assert parting.logits_difference == pytest.approx(shift, rel=0.05)
    # each path's draw wins under its own logits, by no more than the logits' difference moves
    # the two candidates' scores apart
    bound = 2 * parting.logits_difference / 1e-5
    assert 0 <= parting.eager_margin <= bound and 0 <= parting.static_margin <= bound
    # the reference ties the two as the eager path does: the same margin
    assert parting.reference_margin == pytest.approx(parting.eager_margin, abs=1e-3 * bound)
    assert parting.static_logit_error == pytest.approx(shift, rel=0.05)
    assert parting.eager_logit_error < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_logits_are_the_rollouts(family: str) -> None:
    """``eager_logits`` and ``static_logits`` (what ``compare_rollouts`` reads at a flip) are
    each path's own logits: fed a rollout's first k columns, they give the log-probs it recorded
    at column k bit for bit, per-row prompts and rows stopping at different lengths included."""
    model = tiny_model(family, layers=2, heads=4, kv_heads=2, tied=True, seed=1, sharp=6.0)
    policy = make_policy(model, GRAMMAR, lora=True)
    prompt = [PROMPTS[i % 4] for i in range(6)]
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompt, 6)
    replays = {"eager": eager_logits, "static": partial(static_logits, max_length=8)}
    for decode, replay in replays.items():
        policy.decode = decode  # type: ignore[assignment]
        generator = torch.Generator().manual_seed(3)
        rollout = policy.sample(prompt, 6, min_length=1, max_length=8, generator=generator)
        assert len(set(rollout.length.tolist())) > 1
        for k in range(int(rollout.length.max()) + 1):
            logits = replay(policy, prompt_rows, rollout.tokens[:, :k])
            token_lp, stop_lp = token_log_probs(
                logits, rollout.tokens[:, min(k, 7)], policy.stop_id
            )
            live = rollout.length >= k
            assert torch.equal(stop_lp[live], rollout.log_pterm[live, k])
            if k < 8:
                moved = rollout.length > k
                assert torch.equal(token_lp[moved], rollout.log_pf[moved, k])
