"""SMILES: scaffold-conditioned fragment generation scored by QED (RDKit).

Prompt. Each scaffold is a SMILES with exactly one attachment point ``*`` (default the paper's
``O=C1Nc2cc(*)ccc2N1``); its prompt is ``prompt_template`` with ``{scaffold}`` filled in. The model
generates a fragment; the molecule is the scaffold with ``*`` replaced by the fragment text
(``O=C1Nc2cc(CO)ccc2N1`` for ``CO``), so the fragment's first atom bonds where ``*`` was.

Score. Valid iff RDKit parses and sanitises the merged SMILES; S = QED
(``rdkit.Chem.QED.qed``) of the merged molecule, 0 for an invalid or empty fragment. Every
prefix is scored the same way (an unclosed ``C(`` is invalid and scores 0). SubM compares the
merged molecules, never the fragments alone: ``item_features`` gives the Morgan radius-2,
2048-bit fingerprint of the merged molecule packed into 32 uint64 words, and its canonical
SMILES as the dedup key.

Language. The paper's SMILES EBNF (appendix figure "EBNF grammar used for constrained SMILES
decoding") in xgrammar's dialect (its ``bond ::= "" | ...`` empty alternative is dropped: every
use of ``bond`` is already optional; the long ``atom_spec`` and ``chiral_class`` rules are split
into equivalent sub-rules). The alphabet is every character the grammar can emit
except ring-closure digits and ``%`` (a fragment's ring label would clash with the scaffold's
open rings, e.g. ring 2 of the default scaffold is open at ``*``), ``*`` (a second attachment
point) and ``.`` (a disconnected fragment is not a substituent). With digits excluded, bracket
atoms lose their H counts, charges digits and chiral classes but stay expressible
(``[nH]``, ``[O-]``). ``ring_closures=True`` admits the digits and ``%``.

Lengths: 1..10 generated tokens (the paper's setting); 15 in its stress test.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raptb.adapters.tasks.smiles.chem_fp import morgan_packed
from raptb.core.ports import Score, check_length_bounds

if TYPE_CHECKING:
    from rdkit import Chem

DEFAULT_SCAFFOLD = "O=C1Nc2cc(*)ccc2N1"
DEFAULT_PROMPT_TEMPLATE = "Scaffold: {scaffold}\nFragment:"
STRESS_MAX_LENGTH = 15
FINGERPRINT_RADIUS = 2
FINGERPRINT_BITS = 2048
# Characters the grammar can emit that a fragment never uses by default (module docstring).
RING_CLOSURE_CHARS = "0123456789%"
EXCLUDED_CHARS = "*."
# Parsed molecules are memoised per merged SMILES up to this many entries; a long run visits
# millions of prefixes and re-parsing costs tens of microseconds, so an unbounded memo is not worth
# its memory.
MOLECULE_CACHE_LIMIT = 200_000
_INVALID = Score(value=0.0, valid=False)

SMILES_GRAMMAR = r"""root ::= smiles
smiles ::= atom ( chain | branch )*
chain ::= ( dot atom | bond? ( atom | ring_closure ) )+
branch ::= "(" ( ( dot | bond )? smiles )+ ")"
atom ::= organic_symbol | aromatic_symbol | atom_spec | wildcard
bond ::= "=" | "#" | "$" | ":" | "@" | "@@"
dot ::= "."
wildcard ::= "*"
atom_spec ::= "[" bracket_symbol chiral_class? h_count? ( charge | class? ) "]"
bracket_symbol ::= "se" | "as" | aromatic_symbol | element_symbol | wildcard
organic_symbol ::= "B" | "C" | "N" | "O" | "P" | "S" | "F" | "I" | "Br" | "Cl" | "At" | "Ts"
aromatic_symbol ::= "b" | "c" | "n" | "o" | "p" | "s"
element_symbol ::= "A" ( "c" | "g" | "l" | "m" | "r" | "s" | "t" | "u" )
  | "B" ( "a" | "e" | "h" | "i" | "k" | "r" )?
  | "C" ( "a" | "d" | "e" | "f" | "l" | "m" | "n" | "o" | "r" | "s" | "u" )?
  | "D" ( "b" | "s" | "y" )
  | "E" ( "r" | "s" | "u" )
  | "F" ( "e" | "l" | "m" | "r" )?
  | "G" ( "a" | "d" | "e" )
  | "H" ( "e" | "f" | "g" | "o" | "s" )?
  | "I" ( "n" | "r" )?
  | "K" "r"?
  | "L" ( "a" | "i" | "r" | "u" | "v" )
  | "M" ( "c" | "g" | "n" | "o" | "t" )
  | "N" ( "a" | "b" | "d" | "e" | "h" | "i" | "o" | "p" )?
  | "O" ( "g" | "s" )?
  | "P" ( "a" | "b" | "d" | "m" | "o" | "r" | "t" | "u" )?
  | "R" ( "a" | "b" | "e" | "f" | "g" | "h" | "n" | "u" )
  | "S" ( "b" | "c" | "e" | "g" | "i" | "m" | "n" | "r" )?
  | "T" ( "a" | "b" | "c" | "e" | "h" | "i" | "l" | "m" | "s" )
  | "U" | "V" | "W" | "Xe" | "Y" "b"?
  | "Z" ( "n" | "r" )
ring_closure ::= "%" [1-9] [0-9] | [0-9]
chiral_class ::= ( "@" ( "@" | "TH" [1-2] | "AL" [1-2] | "SP" [1-3] | chiral_tb | chiral_oh )? )?
chiral_tb ::= "TB" ( "1" [0-9]? | "2" "0"? | [3-9] )
chiral_oh ::= "OH" ( "1" [0-9]? | "2" [0-9]? | "3" "0"? | [4-9] )
charge ::= "-" ( "-" | "0" | "1" [0-5]? | [2-9] )? | "+" ( "+" | "0" | "1" [0-5]? | [2-9] )?
h_count ::= "H" [0-9]?
class ::= ":" [0-9]+
"""


def grammar_characters(grammar: str = SMILES_GRAMMAR) -> str:
    """Every character a sentence of ``grammar`` can contain: its quoted literals and the digits of
    its ``[0-9]``-style classes (the only classes the SMILES grammar uses), sorted."""
    chars: set[str] = set()
    for literal in re.findall(r'"([^"]*)"', grammar):
        chars.update(literal)
    for low, high in re.findall(r"\[(\d)-(\d)\]", grammar):
        chars.update(str(d) for d in range(int(low), int(high) + 1))
    return "".join(sorted(chars))


def smiles_alphabet(*, ring_closures: bool = False) -> str:
    """Characters a fragment token may use (module docstring): the grammar's characters minus
    ``*`` and ``.``, and minus digits and ``%`` unless ``ring_closures``."""
    excluded = EXCLUDED_CHARS + ("" if ring_closures else RING_CLOSURE_CHARS)
    return "".join(c for c in grammar_characters() if c not in excluded)


def check_scaffold(scaffold: str) -> str:
    """Return ``scaffold`` stripped, or raise ValueError naming it when it does not contain exactly
    one ``*`` or does not parse with RDKit."""
    scaffold = scaffold.strip()
    if scaffold.count("*") != 1:
        raise ValueError(
            f"scaffolds: {scaffold!r} must contain exactly one '*' attachment point, "
            f"found {scaffold.count('*')}"
        )
    from rdkit import Chem  # here, not at the top: a task lookup does not import RDKit
    from rdkit.rdBase import BlockLogs

    with BlockLogs():
        if Chem.MolFromSmiles(scaffold) is None:
            raise ValueError(f"scaffolds: {scaffold!r} is not a valid SMILES")
    return scaffold


def read_scaffolds(path: Path | str) -> list[str]:
    """Scaffolds from a text file: one SMILES per line; blank lines and ``#`` comments skipped."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"scaffolds: cannot read {path} ({exc.strerror})") from None
    scaffolds = [
        check_scaffold(line) for line in lines if line.strip() and not line.lstrip().startswith("#")
    ]
    if not scaffolds:
        raise ValueError(f"scaffolds: {path} lists no scaffold")
    return scaffolds


def merge_fragment(scaffold: str, fragment: str) -> str:
    """The scaffold's SMILES with its ``*`` replaced by ``fragment``."""
    return scaffold.replace("*", fragment, 1)


@dataclass(frozen=True)
class ItemFeatures:
    """Replay-side description of a generated fragment: the merged molecule's packed Morgan
    fingerprint (uint64 [32], all zero when invalid) and its canonical SMILES (None if invalid)."""

    features: np.ndarray
    canonical: str | None


@dataclass
class SmilesTask:
    """The scaffold-conditioned QED task (implements :class:`raptb.core.ports.Task`)."""

    scaffolds: Sequence[str] = (DEFAULT_SCAFFOLD,)
    min_length: int = 1
    max_length: int = 10
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    ring_closures: bool = False
    name: str = field(default="smiles", init=False)
    alphabet: str = field(init=False)
    grammar: str = field(default=SMILES_GRAMMAR, init=False)
    _scaffold_of: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _molecules: dict[str, Chem.Mol | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_length_bounds(self.min_length, self.max_length)
        if "{scaffold}" not in self.prompt_template:
            raise ValueError("prompt_template: must contain the placeholder {scaffold}")
        if isinstance(self.scaffolds, str):
            raise ValueError("scaffolds: expected a list of SMILES, got one string")
        if not self.scaffolds:
            raise ValueError("scaffolds: the list is empty")
        self.scaffolds = tuple(check_scaffold(s) for s in self.scaffolds)
        self.alphabet = smiles_alphabet(ring_closures=self.ring_closures)
        for scaffold in self.scaffolds:
            prompt = self.prompt_template.replace("{scaffold}", scaffold)
            if prompt in self._scaffold_of:
                raise ValueError(f"scaffolds: {scaffold!r} is listed twice")
            self._scaffold_of[prompt] = scaffold

    def prompts(self) -> list[str]:
        """One prompt per scaffold, in the order given."""
        return list(self._scaffold_of)

    def scaffold(self, prompt: str) -> str:
        """The scaffold a prompt of this task was built from."""
        try:
            return self._scaffold_of[prompt]
        except KeyError:
            raise ValueError(f"prompt: {prompt!r} is not one of this task's prompts") from None

    def merge(self, prompt: str, text: str) -> str:
        """The merged SMILES of fragment ``text`` for ``prompt``'s scaffold."""
        return merge_fragment(self.scaffold(prompt), text)

    def molecule(self, prompt: str, text: str) -> Chem.Mol | None:
        """The sanitised merged molecule, or None when ``text`` is empty or it does not parse."""
        if not text:
            return None
        smiles = self.merge(prompt, text)
        if smiles in self._molecules:
            return self._molecules[smiles]
        from rdkit import Chem
        from rdkit.rdBase import BlockLogs

        with BlockLogs():  # RDKit logs every parse error to stderr; invalid prefixes are routine
            mol = Chem.MolFromSmiles(smiles)
        if len(self._molecules) >= MOLECULE_CACHE_LIMIT:
            self._molecules.clear()
        self._molecules[smiles] = mol
        return mol

    def score(self, prompt: str, text: str) -> Score:
        """QED of the merged molecule; invalid (0.0) when it does not parse."""
        mol = self.molecule(prompt, text)
        if mol is None:
            return _INVALID
        from rdkit.Chem import QED

        return Score(value=float(QED.qed(mol)), valid=True)

    def item_features(self, prompt: str, text: str) -> ItemFeatures:
        """Fingerprint and canonical SMILES of the merged molecule, for SubM's Tanimoto backend."""
        mol = self.molecule(prompt, text)
        if mol is None:
            return ItemFeatures(np.zeros(FINGERPRINT_BITS // 64, dtype=np.uint64), None)
        from rdkit import Chem

        canonical = Chem.MolToSmiles(mol)
        fingerprint = morgan_packed([canonical], FINGERPRINT_RADIUS, FINGERPRINT_BITS)[0]
        return ItemFeatures(fingerprint, canonical)
