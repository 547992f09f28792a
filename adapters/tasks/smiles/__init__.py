"""Scaffold-conditioned SMILES scored by QED: the task (``task``), its RDKit fingerprints
(``chem_fp``), its report (``metrics``) and registry entry (``spec``)."""
