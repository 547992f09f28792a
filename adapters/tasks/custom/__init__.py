"""User-defined tasks: a reward function named by dotted path (``task``) and the registry entry
(``spec``)."""
