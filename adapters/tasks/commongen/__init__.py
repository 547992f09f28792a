"""CommonGen: the task (``task``), its concept sets (``data``), English word rules
(``english``), metrics (``metrics``) and registry entry (``spec``)."""
