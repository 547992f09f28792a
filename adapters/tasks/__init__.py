"""The shipped tasks, one folder each with everything of the task together: ``expr24``,
``smiles``, ``commongen``, ``amp``, ``custom`` (a user's reward). Each registers its
``TaskSpec`` (adapters.registry) when imported; their data files sit in its ``files/`` with their
provenance and licence."""
