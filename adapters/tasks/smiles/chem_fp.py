"""RDKit Morgan fingerprints packed into uint64 words for ``raptb.core.subm.similarity``.

Morgan radius 2, 2048 bits by default (the paper's SubM backend for SMILES): bit i of a
fingerprint lands in word i // 64 at position i % 64, giving a [n, 32] uint64 array whose
Tanimoto matrix (``tanimoto_matrix``) equals RDKit's ``BulkTanimotoSimilarity``. An unparsable
SMILES gets the all-zero fingerprint (similarity 0 to everything).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raptb.core.subm.similarity import pack_bits


def morgan_packed(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048) -> np.ndarray:
    """Packed Morgan fingerprints of ``smiles`` -> uint64 [len(smiles), ceil(n_bits / 64)]."""
    from rdkit import Chem, DataStructs  # at use: a task lookup does not import RDKit
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    bits = np.zeros((len(smiles), n_bits), dtype=np.uint8)
    for i, s in enumerate(smiles):
        mol = Chem.MolFromSmiles(s)
        if mol is not None:
            row = np.zeros(0, dtype=np.uint8)
            # ConvertToNumpyArray resizes its target, so it cannot write into a row view.
            DataStructs.ConvertToNumpyArray(gen.GetFingerprint(mol), row)
            bits[i] = row
    return pack_bits(bits.astype(bool))
