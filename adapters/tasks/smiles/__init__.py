"""Scaffold-conditioned SMILES scored by QED: the task (``task``), its RDKit fingerprints
(``chem_fp``) and its report (``metrics``)."""
