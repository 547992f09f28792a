"""AMP: the task (``task``), its oracles (``oracle``), metrics (``metrics``) and registry entry
(``spec``)."""
