"""Scaffold-conditioned SMILES scored by QED: the task (``task``) and its RDKit fingerprints
(``chem_fp``)."""
