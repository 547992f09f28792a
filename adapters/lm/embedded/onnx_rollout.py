"""The lean GPT-2 rollout with each column in one ONNX Runtime call (``onnx_graph``).

The same rollout as ``raptb.adapters.lm.rollout``'s eager path (its docstring states the
behaviour's mask and the recorded log-probabilities) for the models ``lean_gpt2`` supports, on the
CPU in float32: the prompt by ``lean_gpt2.prompt_logits_and_past``, then per column one call of
the ``step`` graph (the forward of the rows' last tokens and the draw of the next ones) with the
keys and values handed back as arrays; the mask rules and the bookkeeping run in NumPy on the
host. The draw is torch.multinomial's (``onnx_graph``), its exponential noise drawn from the
rollout's generator as multinomial draws it: a seed gives the same rows as the eager path, up to
a tie within float rounding, and leaves the generator in the same state.

Rows with prompts of different lengths are left-padded together as on the eager path, the pads
masked out of every column's attention (``key_bias``).

Without a grammar, or with a grammar a task declared as an automaton (its table,
``adapters.lm.table_grammar``), nothing is left for the host between columns: the whole rollout
after the prompt is one call of the ``rollout`` graph (``onnx_graph.rollout_graph``: the columns
in an ONNX ``Loop``, the mask rules and the table inside it), its noise drawn for every column
beforehand from the generator as the column loop draws it and the generator put back to where
the columns used stop. The same rows and generator state as the call per column; in the main job
the rollout 1.33-1.40x faster (``benchmarks/step_speed.md``). That call is, by default
(``policy.compiled_rollout``), the same loop compiled by Numba (``compiled_rollout``: no node
dispatch, the embedded model's rollout about 2x faster again) rather than ONNX Runtime's graph.
xgrammar's matchers keep the call per column.

``usable(model)`` says when it applies (with ``lean_gpt2.supports``), ``preferred(model)`` when
``decode = "auto"`` takes it (small models: ``AUTO_MAX_PARAMETERS``); ``"eager"`` keeps the torch
path, ``"onnx"`` asks for this one wherever it applies.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from raptb.adapters.lm.embedded import compiled_rollout, lean_gpt2
from raptb.adapters.lm.embedded.onnx_builder import ACTIVATIONS, weight_names
from raptb.adapters.lm.embedded.onnx_graph import (
    ColumnShape,
    rollout_graph,
    sample_graph,
    step_graph,
)
from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.rollout_record import Rollout, RolloutTimings, row_temperatures
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids
from raptb.adapters.lm.table_grammar import TableGrammarBatch


def available() -> bool:
    """Whether ONNX Runtime and ONNX (to build the graphs) can be imported."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def usable(model: torch.nn.Module) -> bool:
    """Whether this path runs ``model``'s rollouts: a model ``lean_gpt2`` supports (the caller
    asks that, memoised), with an activation the graph computes (``onnx_builder.ACTIVATIONS``),
    every parameter float32 on the CPU, and ONNX Runtime installed."""
    return (
        getattr(model.config, "activation_function", None) in ACTIVATIONS
        and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
        and _available()
    )


AUTO_MAX_PARAMETERS = 2_000_000
"""The largest model ``decode = "auto"`` hands to this path. One thread, 34 rows, 9 columns, the
two alternating (``python benchmarks/step_speed.py sizes``, 2026-11-29, a 2-core Intel Xeon; GPT-2
shapes with the embedded model's 98-token vocabulary unless said), eager's time over this path's:
1.32-1.37x at 0.11M parameters (the embedded model), 1.26-1.34x at 0.8M, 0.99-1.13x at 4.8M,
0.84-0.87x at 25M, 0.76-0.78x at 18M with GPT-2's 50,257 tokens. Once the products are large,
torch's are the faster ones, and the graph's weights are inputs, not constants ONNX Runtime could
pack once (at 18M the same graph with its weights as constants runs a call 1.2-1.3x faster, still
slower than eager's column)."""


def preferred(model: torch.nn.Module) -> bool:
    """``usable`` and at most ``AUTO_MAX_PARAMETERS`` parameters: where ``auto`` takes it."""
    return sum(p.numel() for p in model.parameters()) <= AUTO_MAX_PARAMETERS and usable(model)


@functools.cache
def _available() -> bool:
    return available()


def column_shape(model: torch.nn.Module, sub_ids: Sequence[int]) -> ColumnShape:
    """The graphs' shape for ``model`` and the behaviour's choices ``sub_ids`` (stop last)."""
    config = model.config
    return ColumnShape(
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        n_inner=config.n_inner or 4 * config.n_embd,
        vocab=model.transformer.wte.weight.shape[0],
        positions=model.transformer.wpe.weight.shape[0],
        eps=float(config.layer_norm_epsilon),
        sub_ids=tuple(int(i) for i in sub_ids),
        activation=ACTIVATIONS[config.activation_function],
    )


def session(graph: bytes, threads: int, profile: str | None = None):
    """An ONNX Runtime session of the serialised ``graph`` on the CPU: ``threads`` intra-op
    threads that sleep rather than spin when idle, errors only in the log; ``profile``: a folder
    for ONNX Runtime's profile of its calls."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile) / "onnx")
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=8)
def sessions(shape: ColumnShape, threads: int) -> tuple:
    """The ``sample`` and ``step`` graphs' sessions (built once per shape and thread count)."""
    return session(sample_graph(shape), threads), session(step_graph(shape), threads)


_SAMPLED = ["choice", "token_lp", "stop_lp", "log_norm"]


def onnx_rollout(
    policy,
    prompt: str | Sequence[str],
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None,
) -> Rollout:
    """``sample_rollout`` on this path (``policy``: ``rollout.RolloutPolicy``); rows with
    prompts of different lengths are left-padded together, their pads masked by ``key_bias``."""
    check_rollout_shape(n, min_length, max_length)
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompt, n)
    policy.check_positions(max(len(row) for row in prompt_rows), max_length)
    start = time.perf_counter()
    model = policy.model
    big_t, num_legal = max_length, len(policy.legal_ids)
    sub_ids = np.array([*policy.legal_ids, policy.stop_id], dtype=np.int64)
    shape = column_shape(model, sub_ids.tolist())
    sample, step = sessions(shape, torch.get_num_threads())
    temp = row_temperatures(temperature, n).numpy()[:, None]
    grammar = policy.grammar_batch(n)
    one_call = policy.one_call and not isinstance(grammar, GrammarBatch)
    # one prompt for all rows, and the compiled loop: it runs the prompt's forward itself, once
    shared = all(row == prompt_rows[0] for row in prompt_rows)
    own_prompt = one_call and policy.compiled_rollout and shared
    with torch.inference_mode():
        tic = time.perf_counter()
        # the parameters' own memory: the graph sees the optimizer's in-place updates (one walk
        # of the modules: get_parameter per name took 4x as long; lm_head's is wte's when tied)
        params = dict(model.named_parameters())
        params["lm_head.weight"] = model.lm_head.weight
        feeds: dict[str, np.ndarray] = {
            name: params[name].detach().numpy() for name in weight_names(shape)
        }
        if not own_prompt:
            logits, past, position, key_mask = lean_gpt2.prompt_logits_and_past(
                model, prompt_rows, policy.pad_id, policy.device
            )
            # 0 where a query may look, -inf on the pads; a column's own 0 added as it is
            # computed
            key_bias = np.zeros((n, past[0][0].shape[2]), dtype=np.float32)
            if key_mask is not None:
                key_bias[~key_mask.numpy()] = -np.inf
            first = {"logits": logits.contiguous().numpy()}
            for layer, (keys, values) in enumerate(past):
                feeds[f"past_k{layer}"] = keys.expand(n, -1, -1, -1).contiguous().numpy()
                feeds[f"past_v{layer}"] = values.expand(n, -1, -1, -1).contiguous().numpy()
            positions = position[:, 0].contiguous().numpy().copy()
        model_s = time.perf_counter() - tic
    if own_prompt:
        first = {"prompt_ids": np.array(prompt_rows[0], dtype=np.int64)}
        key_bias = np.zeros((n, len(prompt_rows[0])), dtype=np.float32)
        positions = np.full(n, len(prompt_rows[0]), dtype=np.int64)
    if one_call:
        feeds |= first | {"temperature": temp}
        feeds |= _table_feeds(grammar, shape.width)
        return _one_call(
            policy, feeds, key_bias, positions, shape, (n, min_length, big_t), generator, start
        )
    if grammar is not None:
        grammar.reset()
    grammar_s = 0.0
    presents = [f"present_{kv}{layer}" for layer in range(shape.n_layer) for kv in "kv"]
    feeds["temperature"] = temp
    tokens = np.full((n, big_t), policy.pad_id, dtype=np.int64)
    log_pf = np.zeros((n, big_t), dtype=np.float32)
    log_pterm = np.zeros((n, big_t + 1), dtype=np.float32)
    length = np.full(n, big_t, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    step_tokens = np.full(n, policy.pad_id, dtype=np.int64)
    for k in range(big_t + 1):
        tic = time.perf_counter()
        if grammar is None or k == big_t:  # (the last column only reads the stop's)
            mask = np.ones((n, num_legal + 1), dtype=bool)
        else:
            mask = grammar.next_mask().numpy()
        grammar_s += time.perf_counter() - tic
        # a finished row may only stop; below min_length no row may stop, and a dead end stops
        # (a new array: the grammar's mask is its own buffer)
        mask = mask & active[:, None]
        if k < min_length:
            mask[:, num_legal] = False
        mask[:, num_legal] |= ~mask.any(axis=1)
        feeds["mask"] = mask
        if k == big_t:  # only the stop's log-probability is read: no draw
            feeds["noise"] = np.ones((n, num_legal + 1), dtype=np.float32)
        else:  # torch.multinomial's noise, from the same generator in the same order
            noise = torch.empty((n, num_legal + 1), dtype=torch.float32)
            feeds["noise"] = noise.exponential_(generator=generator).numpy()
        tic = time.perf_counter()
        if k == 0:
            out = sample.run(_SAMPLED, {**first, **_sample_feeds(feeds)})
        else:
            key_bias = np.concatenate([key_bias, np.zeros((n, 1), dtype=np.float32)], axis=1)
            feeds |= {"tokens": step_tokens, "positions": positions, "key_bias": key_bias}
            out = step.run(_SAMPLED + presents, feeds)
            for name, value in zip(presents, out[len(_SAMPLED) :], strict=True):
                feeds[name.replace("present", "past")] = value
            positions = positions + 1
        model_s += time.perf_counter() - tic
        choice, token_lp, stop_lp, log_norm = out[: len(_SAMPLED)]
        log_pterm[:, k] = np.where(active, stop_lp, 0.0)
        if k == big_t:
            break
        if not np.isfinite(log_norm).all():  # as torch.multinomial refuses such a distribution
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        stops = active & (choice == num_legal)
        moves = active & ~stops
        step_tokens = np.where(moves, sub_ids[choice], policy.pad_id)
        tokens[:, k] = step_tokens
        log_pf[:, k] = np.where(moves, token_lp, 0.0)
        length[stops] = k
        active = moves
        rows = np.flatnonzero(moves).tolist()
        if not rows:
            break
        if grammar is not None:
            tic = time.perf_counter()
            accepted = grammar.accept_many(rows, step_tokens[rows].tolist())
            grammar_s += time.perf_counter() - tic
            if not all(accepted):
                raise RuntimeError("grammar matcher rejected a token its own mask allowed")
    return _recorded(policy, tokens, length, log_pf, log_pterm, (model_s, grammar_s, start))


def _sample_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: feeds[name] for name in ("mask", "temperature", "noise")}


@functools.lru_cache(maxsize=8)
def rollout_session(shape: ColumnShape, threads: int):
    """The ``rollout`` graph's session (built once per shape and thread count)."""
    return session(rollout_graph(shape), threads)


def _table_feeds(grammar: TableGrammarBatch | None, width: int) -> dict[str, np.ndarray]:
    """The ``rollout`` graph's grammar: the automaton's table, its stop column's next state 0
    (never read: a stopped row keeps its state); without a grammar one state allowing all."""
    if grammar is None:
        return {
            "table_mask": np.ones((1, width), dtype=bool),
            "table_next": np.zeros((1, width), dtype=np.int64),
        }
    table = grammar.table
    stop = np.zeros((table.num_states, 1), dtype=np.int64)
    return {
        "table_mask": table.mask,
        "table_next": np.concatenate([table.next_state, stop], axis=1),
    }


def _one_call(
    policy,
    feeds: dict[str, np.ndarray],
    key_bias: np.ndarray,
    positions: np.ndarray,
    shape: ColumnShape,
    sizes: tuple[int, int, int],
    generator: torch.Generator | None,
    start: float,
) -> Rollout:
    """The rollout's columns in one call of the ``rollout`` graph (its docstring), for rows
    without a grammar or with an automaton's table: the same rows, log-probabilities and
    generator state as the column-by-column loop. ``sizes``: the rows, min_length and T;
    ``start``: when the rollout began (its prompt's forward is in the model's time)."""
    n, min_length, big_t = sizes
    width = shape.width
    source = torch.default_generator if generator is None else generator
    # every column's noise as the column loop draws it, and the generator's state after each
    # (put back below to where the columns used leave it: a state is 5 us, a column's redraw 20)
    noise = torch.empty((big_t, n, width))
    after = []
    for column in noise:
        column.exponential_(generator=source)
        after.append(source.get_state())
    feeds |= {
        "key_bias": key_bias,
        "positions": positions,
        "noise": noise.numpy(),
        "min_length": np.array(min_length, dtype=np.int64),
        "columns": np.array(big_t, dtype=np.int64),
        "pad": np.array(policy.pad_id, dtype=np.int64),
    }
    if policy.compiled_rollout:
        outputs = compiled_rollout.run(feeds, shape)
    else:
        outputs = rollout_session(shape, torch.get_num_threads()).run(None, feeds)
    last_stop, last_active, *scanned = outputs
    model_s = time.perf_counter() - start
    step_tokens, token_lp, stop_lp, log_norm, active, moves = scanned
    used = len(step_tokens)  # columns drawn: the loop stops after one where no row moved
    if used < big_t:  # (the loop draws at least one column: used >= 1)
        source.set_state(after[used - 1])
    if not np.isfinite(log_norm).all():  # as torch.multinomial refuses such a distribution
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    tokens = np.full((n, big_t), policy.pad_id, dtype=np.int64)
    log_pf = np.zeros((n, big_t), dtype=np.float32)
    log_pterm = np.zeros((n, big_t + 1), dtype=np.float32)
    length = np.full(n, big_t, dtype=np.int64)
    if used:  # (with T = 0 no column is drawn and the scans come back [0, 0])
        tokens[:, :used] = step_tokens.T
        log_pf[:, :used] = np.where(moves, token_lp, 0.0).T
        log_pterm[:, :used] = np.where(active, stop_lp, 0.0).T
        stopped = (active & ~moves).T  # [n, used]: the column where each row stopped
        length = np.where(stopped.any(axis=1), stopped.argmax(axis=1), big_t)
    if used == big_t:
        log_pterm[:, big_t] = np.where(last_active, last_stop, 0.0)
    return _recorded(policy, tokens, length, log_pf, log_pterm, (model_s, 0.0, start))


def _recorded(
    policy,
    tokens: np.ndarray,
    length: np.ndarray,
    log_pf: np.ndarray,
    log_pterm: np.ndarray,
    times: tuple[float, float, float],
) -> Rollout:
    """The ``Rollout`` of the host arrays, on the policy's device, with each row's ids and text;
    ``times``: the model's and the grammar's seconds and when the rollout began."""
    model_s, grammar_s, start = times
    row_ids = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    device = policy.device
    return Rollout(
        torch.from_numpy(tokens).to(device),
        torch.from_numpy(length).to(device),
        torch.from_numpy(log_pf).to(device),
        torch.from_numpy(log_pterm).to(device),
        [policy.row_text(row) for row in row_ids],
        row_ids,
        RolloutTimings(model_s, grammar_s, time.perf_counter() - start),
    )
